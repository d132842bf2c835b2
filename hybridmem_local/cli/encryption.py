"""The encryption-at-rest commands of ``hybridmem`` (mounted by ``cli/main.py``): ``master-key``
(create, check, rotate the store's master key) and ``encrypt`` (a plaintext store in place).

``hybridmem keys`` manages the service's API keys; these manage the key the store is encrypted
with. No command takes a key on the command line (it would show in ``ps`` and shell history):
the key in force comes from the usual places (``storage.encryption.load_keys``: the systemd
credential, ``store.key_file``, ``$HYBRIDMEM_MASTER_KEY``), a new one from a file. The work is
done by ``storage/rekey.py``; these are its flags.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from hybridmem_local.cli.common import (
    USER_ERRORS,
    ConfigOptions,
    Output,
    StoreOptions,
    print_data,
    print_json,
    with_options,
)
from hybridmem_local.cli.console import console
from hybridmem_local.cli.errors import fail, reported
from hybridmem_local.storage import encryption
from hybridmem_local.storage.encryption import StoreKeys

master_key_app = typer.Typer(
    help="The master key the store is encrypted with: create, check, rotate.",
    no_args_is_help=True,
    add_completion=False,
)


def _keys_in_force(options: ConfigOptions) -> StoreKeys:
    """The master key from the usual places, whether or not the config already says
    ``store.encryption: sqlcipher`` (``encrypt`` runs before the switch is flipped)."""
    store = options.config.store.model_copy(update={"encryption": "sqlcipher"})
    keys = encryption.load_keys(store)
    assert keys is not None  # load_keys raises rather than return None for sqlcipher
    return keys


@master_key_app.command("create")
def master_key_create(
    out: Annotated[
        Path, typer.Option("--out", help="The key file to write (0600; an existing file is never replaced).")
    ],
) -> None:
    """Write a new random 256-bit master key (64 hex digits) to a file readable by you alone."""
    with reported(*USER_ERRORS):
        master = encryption.generate_master_key()
        try:
            fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise fail(f"{out} exists; a key file is never overwritten (losing a key loses its store)") from None
        with os.fdopen(fd, "w") as handle:
            handle.write(master.hex() + "\n")
            handle.flush()
            os.fsync(handle.fileno())
    typer.echo(
        f"wrote master key {encryption.key_id(master)} to {out}\n"
        "Back it up apart from the store: without it the store cannot be read. Give it to hybridmem as one of\n"
        "  store.key_file: <path>                               (in the config; the file stays 0600)\n"
        f"  ${encryption.KEY_ENV}=<the file's contents>     (environment)\n"
        f"  systemd: LoadCredential={encryption.CREDENTIAL_NAME}:<path>   (or LoadCredentialEncrypted=)\n"
        "then set store.encryption: sqlcipher (a plaintext store: `hybridmem encrypt --db PATH` first)."
    )


@master_key_app.command("check")
@with_options
def master_key_check(*, store: StoreOptions, output: Output) -> None:
    """Load the key as the config says, open the store and its LLM cache with it, and verify
    every page (SQLCipher's HMACs, SQLite's integrity check). Exit code 1 on any failure."""
    from hybridmem_local.storage.rekey import check_store

    with reported(*USER_ERRORS):
        keys = _keys_in_force(store)
        report = check_store(store.db, keys)
    if output.as_json:
        print_json(report)
    else:
        console.print(f"key {report.key_id} from {report.key_source}")
        for name, file in (("store", report.database), ("LLM cache", report.llm_cache)):
            if file is None:
                console.print(f"{name}: none")
                continue
            colour = "green" if file.ok else "red"
            console.print(
                f"{name}: {file.path} (recorded key id {file.recorded_key_id or 'none'}): [{colour}]{file.status}[/]"
            )
    if not report.ok:
        raise fail("the check failed (see above)")


@master_key_app.command("rotate")
@with_options
def master_key_rotate(
    new_key_file: Annotated[
        Path, typer.Option("--new-key-file", help="The new master key (`hybridmem master-key create --out FILE`).")
    ],
    *,
    store: StoreOptions,
    output: Output,
) -> None:
    """Re-encrypt the store, its LLM cache and exports from the key in force to a new one.
    Stop the service first (refused otherwise). Interrupted, it finishes when run again."""
    from hybridmem_local.storage.rekey import rotate_key

    with reported(*USER_ERRORS):
        old = _keys_in_force(store)
        new = StoreKeys(encryption.read_key_file(new_key_file), str(new_key_file))
        report = rotate_key(store.db, old, new)
    if output.as_json:
        print_json(report)
        return
    print_data(report, False, title="master key rotated")
    console.print(
        f"The store now needs key {report.new_key_id}: put {new_key_file} where the old key was "
        "(store.key_file, the systemd credential or the environment), keep a backup of it, and destroy "
        "the old key once no backup made with it is needed. The index files were removed: they rebuild from the "
        "store, sealed with the new key, on next open."
    )


@with_options
def encrypt(*, store: StoreOptions, output: Output) -> None:
    """Encrypt a plaintext store in place with the master key from the usual places (its LLM
    cache and exports too). Stop the service first. A crash leaves the old store intact."""
    from hybridmem_local.storage.rekey import encrypt_store

    with reported(*USER_ERRORS):
        keys = _keys_in_force(store)
        report = encrypt_store(store.db, keys)
    if output.as_json:
        print_json(report)
        return
    print_data(report, False, title="store encrypted")
    console.print(
        f"Now set store.encryption: sqlcipher in the config. The index files rebuild, sealed, on next open. "
        f"Back up the key ({report.key_id}) apart from the store: without it the store is lost. The old "
        "plaintext file's disk blocks were freed, not overwritten: only full-disk encryption covers those."
    )
