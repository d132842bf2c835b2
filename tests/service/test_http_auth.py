"""The authorisation matrix, randomised over namespaces and keys (seeded: set HYBRIDMEM_TEST_SEED
to replay another draw): no key, wrong key, revoked key, a key of other namespaces, a role too
low for the route, non-admin keys on admin routes. Every refusal changes nothing stored.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Any

import pytest

from hybridmem_local.schema import TupleDraft
from hybridmem_local.service.keys import Role
from tests.service.http_harness import live_service, session_body, store_snapshot

SEED = int(os.environ.get("HYBRIDMEM_TEST_SEED", "14"))
NAMESPACES = [f"team-{i}" for i in range(6)]
#: Namespaces holding data; the others do not exist. A refusal must look the same for both.
EXISTING = NAMESPACES[:3]


@dataclass(frozen=True)
class Route:
    role: Role
    method: str
    path: str
    body: Any = None
    #: Statuses when the key may use the route (each request is built to change nothing).
    allowed: frozenset[int] = frozenset({200})


ROUTES = [
    Route(Role.read, "GET", "/v1/namespaces/{ns}/memories?limit=5"),
    Route(Role.read, "POST", "/v1/namespaces/{ns}/search", {"query": "who ran a race?", "k": 1}),
    Route(Role.read, "GET", "/v1/namespaces/{ns}/stats"),
    Route(Role.read, "GET", "/v1/namespaces/{ns}/memories/999999", allowed=frozenset({404})),
    Route(Role.read, "GET", "/v1/namespaces/{ns}/memories/999999/history", allowed=frozenset({404})),
    Route(Role.read, "GET", "/v1/namespaces/{ns}/sessions/nope", allowed=frozenset({404})),
    Route(Role.read, "GET", "/v1/namespaces/{ns}/export", allowed=frozenset({200, 404})),
    Route(Role.write, "DELETE", "/v1/namespaces/{ns}/memories/999999", allowed=frozenset({404})),
    Route(
        Role.write,
        "POST",
        "/v1/namespaces/{ns}/memories",
        {
            "tuples": [
                {"entity": "A", "relation": "r", "object": "B", "timestamp": "2023", "source_turn_ids": ["no:such"]}
            ]
        },
        allowed=frozenset({422}),
    ),
    Route(
        Role.write,
        "POST",
        "/v1/namespaces/{ns}/sessions/batch",
        {"sessions": [session_body("twice", ["hello"]), session_body("twice", ["hello again"], prefix="other")]},
        allowed=frozenset({409}),
    ),
    Route(Role.admin, "POST", "/v1/namespaces/{ns}/consolidation-runs/999999/undo", allowed=frozenset({404})),
    Route(Role.admin, "GET", "/v1/namespaces/{ns}/redactions"),
    Route(Role.admin, "POST", "/v1/namespaces/{ns}/redactions/999999/undo", allowed=frozenset({404})),
    Route(Role.admin, "POST", "/v1/namespaces/{ns}/redactions/999999/confirm", allowed=frozenset({404})),
    Route(Role.admin, "DELETE", "/v1/keys/ffffffff", allowed=frozenset({404})),
    Route(Role.admin, "GET", "/v1/keys"),
]


@pytest.fixture(scope="module")
def service(tmp_path_factory, hashing_embedder):
    with live_service(
        tmp_path_factory.mktemp("auth") / "memory.db",
        hashing_embedder,
        None,
        start_worker=False,
        **{"service.rate_limit_per_s": 1000.0, "service.rate_limit_burst": 1000},
    ) as svc:
        with svc.state.memory() as memory:
            for ns in EXISTING:
                memory.add_memories(
                    ns, tuples=[TupleDraft(entity="Bob", relation="ran", object="a 10K", timestamp="2023-05-07")]
                )
        yield svc


@pytest.fixture(scope="module")
def keyring(service):
    """Random keys: 1-3 namespaces each, every role; plus one revoked key per role."""
    rng = random.Random(SEED)
    keys = []
    for role in [*Role] * 4:
        api_key, token = service.state.keys.create(rng.sample(NAMESPACES, rng.randint(1, 3)), role)
        keys.append((api_key, token))
    revoked = []
    for role in Role:
        api_key, token = service.state.keys.create(list(NAMESPACES), role)
        service.state.keys.revoke(api_key.key_id)
        revoked.append(token)
    return keys, revoked


def _send(client, route: Route, ns: str, headers: dict[str, str]):
    return client.request(route.method, route.path.format(ns=ns), json=route.body, headers=headers)


def test_random_requests_get_exactly_the_access_their_key_grants(service, keyring):
    keys, revoked = keyring
    rng = random.Random(SEED)
    some_id = keys[0][0].key_id
    before = store_snapshot(service.db)
    outcomes = {"unauthorized": 0, "forbidden": 0, "allowed": 0}
    with service.client() as client:
        for trial in range(200):
            route, ns = rng.choice(ROUTES), rng.choice(NAMESPACES)
            credential = rng.choices(["none", "wrong", "garbage", "revoked", "key"], weights=[1, 1, 1, 1, 8])[0]
            key = None
            if credential == "none":
                headers = {}
            elif credential == "wrong":  # a real key id with a secret that is not its own
                headers = {"Authorization": f"Bearer hm_{some_id}_{'x' * 43}"}
            elif credential == "garbage":
                headers = {"Authorization": f"Bearer {rng.randbytes(24).hex()}"}
            elif credential == "revoked":
                headers = {"Authorization": f"Bearer {rng.choice(revoked)}"}
            else:
                key, token = rng.choice(keys)
                headers = {"Authorization": f"Bearer {token}"}
            response = _send(client, route, ns, headers)
            where = f"seed {SEED} trial {trial}: {credential} {key} {route.method} {route.path} on {ns}"
            if key is None:
                expected, outcome = {401}, "unauthorized"
            elif not key.covers(ns) and "{ns}" in route.path or key.role.rank < route.role.rank:
                expected, outcome = {403}, "forbidden"
            else:
                expected, outcome = set(route.allowed), "allowed"
            assert response.status_code in expected, f"{where}: {response.status_code} {response.text}"
            if outcome != "allowed":
                assert response.json()["error"]["code"] == outcome, where
            outcomes[outcome] += 1
    assert min(outcomes.values()) >= 20, outcomes  # the draw exercised every branch
    assert store_snapshot(service.db) == before


def test_a_refusal_does_not_tell_whether_the_namespace_exists(service, keyring):
    keys, _ = keyring
    with service.client() as client:
        for key, token in keys:
            outside = [ns for ns in NAMESPACES if not key.covers(ns)]
            messages = set()
            for ns in outside:
                response = client.get(f"/v1/namespaces/{ns}/stats", headers={"Authorization": f"Bearer {token}"})
                assert response.status_code == 403
                messages.add(response.json()["error"]["message"].replace(repr(ns), "<ns>"))
            # Existing and missing namespaces among `outside` got the very same answer.
            assert len(messages) <= 1, messages


def test_admin_routes_refuse_read_and_write_keys_and_admins_of_other_namespaces(service):
    rng = random.Random(SEED + 1)
    ns = rng.choice(EXISTING)
    other = rng.choice([n for n in NAMESPACES if n != ns])
    tokens = {
        "read": service.state.keys.create([ns], "read")[1],
        "write": service.state.keys.create([ns], "write")[1],
        "admin elsewhere": service.state.keys.create([other], "admin")[1],
    }
    admin_routes = [
        ("DELETE", f"/v1/namespaces/{ns}", None),
        ("POST", f"/v1/namespaces/{ns}/consolidate", {"dry_run": True}),
        ("POST", f"/v1/namespaces/{ns}/consolidation-runs/1/undo", None),
        ("GET", f"/v1/namespaces/{ns}/redactions", None),
        ("POST", f"/v1/namespaces/{ns}/redactions/1/undo", None),
        ("POST", f"/v1/namespaces/{ns}/redactions/1/confirm", None),
    ]
    key_routes = [
        ("GET", "/v1/keys", None),
        ("POST", "/v1/keys", {"namespaces": [ns], "role": "read"}),
        ("DELETE", "/v1/keys/ffffffff", None),
    ]
    before = store_snapshot(service.db)
    with service.client() as client:
        for who, token in tokens.items():
            routes = admin_routes + (key_routes if who != "admin elsewhere" else [])
            for method, path, body in routes:
                response = client.request(method, path, json=body, headers={"Authorization": f"Bearer {token}"})
                assert response.status_code == 403, f"{who} {method} {path}: {response.text}"
                assert response.json()["error"]["code"] == "forbidden"
        # The admin of another namespace may use the key routes, but cannot make keys for `ns`.
        elsewhere = {"Authorization": f"Bearer {tokens['admin elsewhere']}"}
        assert client.post("/v1/keys", json={"namespaces": [ns], "role": "read"}, headers=elsewhere).status_code == 403
        assert client.delete(f"/v1/namespaces/{ns}", headers=elsewhere).status_code == 403
    assert store_snapshot(service.db) == before
    with service.state.memory() as memory:
        assert memory.stats(ns).counts["tuples_active"] == 1  # forget was refused every time
