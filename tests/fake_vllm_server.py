"""A real HTTP server on 127.0.0.1 speaking the endpoints of ``vllm serve`` that the
openai-server backend uses (``/v1/models``, ``/v1/chat/completions``, ``/tokenize``), with the
reply to each request chosen by a Python function: the stand-in for a vLLM server, which
cannot run here. The responder sees the whole request (so it can answer each curation window)
and the attempt number of the request's key.

A responder returns one of:

* ``str`` — the assistant message content;
* ``Sleep(seconds, then)`` — wait, then answer ``then`` (a client with a shorter timeout gives up);
* ``Status(code)`` — an HTTP error with an OpenAI-style error body;
* ``Hangup()`` — close the connection without any response;
* ``Barrier(then)`` — wait until ``barrier_parties`` requests are in flight at once, then answer
  ``then`` (proves a batch is sent concurrently).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SERVED_MODEL = "qwen3-8b"

_TURN_LINE = re.compile(r"^\[([^\]]+)\] ([^:]+): (.*)$", re.MULTILINE)


@dataclass
class Sleep:
    seconds: float
    then: str


@dataclass
class Status:
    code: int


@dataclass
class Hangup:
    pass


@dataclass
class Barrier:
    then: str


Action = str | Sleep | Status | Hangup | Barrier
Responder = Callable[[dict, int], Action]


def turn_lines(body: dict) -> list[tuple[str, str, str]]:
    """(turn id, speaker, text) of every turn line in the request's user message."""
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return _TURN_LINE.findall(user)


def curation_reply(body: dict) -> str:
    """A valid CurationReply for the window a curation request shows: one episode for the
    window and one tuple per turn, each citing its turns."""
    turns = turn_lines(body)
    episode = {
        # Named after everyone who speaks: an episode of the whole window is about all of them
        # (one person's name over another's news is what curation's speaker check leaves out).
        "title": f"Talk of {' and '.join(dict.fromkeys(t[1] for t in turns))}",
        "summary": turns[0][2][:80],
        "details": " ".join(t[2] for t in turns),
        "timestamp": "2023-05-08",
        "source_turn_ids": [t[0] for t in turns],
    }
    tuples = [
        {
            "entity": speaker,
            "relation": "mentioned",
            "object": text[:60],
            "timestamp": "2023-05-08",
            "context": f"turn {turn_id}",
            "source_turn_ids": [turn_id],
        }
        for turn_id, speaker, text in turns
    ]
    return json.dumps({"episodes": [episode], "tuples": tuples})


class ChatServer:
    """Serves until ``stop()``; ``requests`` records every chat body, ``attempts`` counts them
    per key (the responder's second argument is the attempt number of the request's key);
    every reply reports ``usage`` as its (prompt, completion) tokens."""

    def __init__(
        self,
        respond: Responder,
        key: Callable[[dict], str] = lambda body: "all",
        usage: tuple[int, int] = (100, 20),
        barrier_parties: int = 1,
    ):
        self.respond = respond
        self.key = key
        self.usage = usage
        self.barrier = threading.Barrier(barrier_parties, timeout=10)
        self.requests: list[dict] = []
        self.attempts: dict[str, int] = {}
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, payload) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/v1/models":
                    self._send(
                        200,
                        {
                            "object": "list",
                            "data": [{"id": SERVED_MODEL, "object": "model", "created": 0, "owned_by": "test"}],
                        },
                    )
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/tokenize":
                    # Whitespace words: a crude count, but the one every budget in a test sees.
                    self._send(200, {"count": len(body["prompt"].split()), "max_model_len": 8192, "tokens": []})
                    return
                key = server.key(body)
                with server.lock:
                    server.requests.append(body)
                    attempt = server.attempts.get(key, 0) + 1
                    server.attempts[key] = attempt
                action = server.respond(body, attempt)
                if isinstance(action, Sleep):
                    time.sleep(action.seconds)
                    action = action.then
                if isinstance(action, Barrier):
                    server.barrier.wait()
                    action = action.then
                if isinstance(action, Hangup):
                    self.close_connection = True
                    self.connection.close()
                    return
                if isinstance(action, Status):
                    self._send(
                        action.code,
                        {"error": {"message": "scripted failure", "type": "ServerError", "code": action.code}},
                    )
                    return
                self._send(
                    200,
                    {
                        "id": f"chatcmpl-{attempt}",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body["model"],
                        "choices": [
                            {"index": 0, "message": {"role": "assistant", "content": action}, "finish_reason": "stop"}
                        ],
                        "usage": {
                            "prompt_tokens": server.usage[0],
                            "completion_tokens": server.usage[1],
                            "total_tokens": sum(server.usage),
                        },
                    },
                )

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def overrides(self, **extra) -> dict:
        """Config overrides that point the openai-server backend at this server."""
        return {"llm.backend": "openai-server", "llm.model": SERVED_MODEL, "llm.base_url": self.base_url, **extra}

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def session_key(body: dict) -> str:
    """Requests keyed by the session of their first turn line (``s3:0`` → ``s3``)."""
    turns = turn_lines(body)
    return turns[0][0].split(":")[0] if turns else "none"
