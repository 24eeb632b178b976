"""Fingerprints: digests of everything a resume depends on, component by component.

=========== ===================================================================================
component   what is recorded
=========== ===================================================================================
code        the task's code epoch (``Task(version=...)``), each step function's ``version`` and a
            SHA-256 of its source (a *hint*: an edit with an unchanged version is a warning)
deps        ``name -> version`` of installed distributions (``importlib.metadata``): all of them,
            or the task's declared list; plus the SHA-256 of each lock file found in the project
            (``uv.lock``, ``poetry.lock``, ``pylock.toml``, ``requirements*.txt``)
env         Python version and implementation, platform, and the task's declared environment
            variables -- as *keyed digests* only, never their values
inputs      digests of the task's declared external inputs: files, directory trees, and sources
            registered with a callable (an HTTP ETag, a database version, ...)
artifacts   for artifacts the task exports to files: the digest committed (in the checkpoint)
            against the file on disk now
model       the model steps call through ``ctx.model``: its spec, the model's own name, the
            endpoint's base URL and the tokenizer that counts its tokens (world format 2; a
            checkpoint of format 1 has none: reported as ``not recorded``, never as drift)
=========== ===================================================================================

Steps record what *they* read the same way (``DoneEntry.reads``), so a drift affects exactly the
steps that read what drifted (see :mod:`overnight.verify.drift`).

Keyed digests of declared environment variables: ``env-hmac:<key id>:<hex>``, HMAC-SHA256 over
``name NUL value`` with a per-task key derived from the task's random salt (in its spec) *and* a
key that is not in the store -- the signing key when set, else a per-user key file
(:mod:`overnight.keys`). Someone who has the store, but not that key, cannot confirm a
guessed value (a dictionary attack on ``hunter2`` fails). The price: a machine without the key
cannot compare the digest either, and reports the variable as ``cannot compare`` (never as
changed); the drift policy decides. Digests written before this scheme (``hmac-sha256:<hex>``,
keyed by the salt alone) are still compared the old way.
"""

from __future__ import annotations

from overnight.chain.records import WORLD_FORMAT

import hashlib
import hmac
import os
import platform
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from overnight.codec import digest
from overnight.codec.canonical import dumps
from overnight.errors import ConfigError
from overnight.verify.dists import cached_distributions
from overnight.keys import EnvKey, env_key

COMPONENTS = ("code", "deps", "env", "inputs", "artifacts", "model")
NOT_RECORDED = "not recorded"
LOCK_FILES = ("uv.lock", "poetry.lock", "pylock.toml", "Pipfile.lock")
LOCK_GLOBS = ("requirements*.txt",)
MISSING = "missing"
UNSET = "unset"
NOT_PINNED = ("overnight", "pip", "setuptools")
"""Recorded, but left out of ``env export``'s pins: overnight itself (installed from wherever the
user installs it, often an editable clone) and the installer's own tools, as ``pip freeze`` does."""


def normalize(name: str) -> str:
    """PEP 503 normalized distribution name (``Foo_Bar`` -> ``foo-bar``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(names: list[str] | None = None) -> dict[str, str]:
    """``normalized name -> version`` of installed distributions, as import would see them (the
    first on ``sys.path`` wins). ``names``: only these (a missing one maps to ``"missing"``)."""
    if names is not None:  # look up only these: reading every distribution's metadata costs ~0.5 s
        import importlib.metadata as md

        out = {}
        for n in sorted(names):
            try:
                out[normalize(n)] = md.distribution(n).version
            except md.PackageNotFoundError:
                out[normalize(n)] = MISSING
        return out
    return cached_distributions(_scan_installed)  # ~0.5 s to read; cached per sys.path and dist-info mtimes


def _scan_installed() -> dict[str, str]:
    """Every installed distribution's ``normalized name -> version`` (the first on ``sys.path`` wins)."""
    import importlib.metadata as md

    found: dict[str, str] = {}
    for dist in md.distributions():
        name, version = _name_version(dist)
        if name:
            found.setdefault(normalize(name), version)
    return dict(sorted(found.items()))


def _name_version(dist) -> tuple[str | None, str | None]:  # type: ignore[no-untyped-def]
    """``Name`` and ``Version`` from the header of a distribution's metadata, read line by line up
    to the first blank line (the email parser would also parse the long description: ~1 ms per
    distribution, ~0.5 s per run for a few hundred); the email parser when the header lacks one."""
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    name = version = None
    for line in text.splitlines():
        if not line.strip():
            break
        key, sep, value = line.partition(":")
        if sep and key == "Name" and name is None:
            name = value.strip()
        elif sep and key == "Version" and version is None:
            version = value.strip()
    if name is None or version is None:
        meta = dist.metadata
        return (meta["Name"] if meta else None), dist.version
    return name, version


def digest_path(path: str | os.PathLike) -> str:
    """Digest of a file (its bytes) or a directory tree (relative paths, kinds and file digests,
    sorted; ``__pycache__`` and ``.git`` skipped). ``"missing"`` when it does not exist."""
    p = Path(path)
    try:
        st = p.lstat()
    except FileNotFoundError:
        return MISSING
    if stat.S_ISLNK(st.st_mode):
        return "link:" + digest.sha256(os.readlink(p).encode("utf-8", "surrogateescape"))
    if stat.S_ISREG(st.st_mode):
        h = hashlib.sha256()
        with open(p, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        return "sha256:" + h.hexdigest()
    if stat.S_ISDIR(st.st_mode):
        entries = []
        for root, dirs, files in os.walk(p):
            dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", ".git"))
            for f in sorted(files):
                full = Path(root) / f
                entries.append([full.relative_to(p).as_posix(), digest_path(full)])
        return "tree:" + digest.sha256(dumps(entries))
    return "other:" + str(stat.S_IFMT(st.st_mode))


def listing_digest(path: str | os.PathLike) -> str:
    """Digest of a directory's *listing*: the sorted relative paths of its files, not their contents
    (``__pycache__`` and ``.git`` skipped); ``"missing"`` when it does not exist."""
    p = Path(path)
    if not p.is_dir():
        return MISSING
    names = []
    for root, dirs, files in os.walk(p):
        dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", ".git"))
        names += [(Path(root) / f).relative_to(p).as_posix() for f in files]
    return "listing:" + digest.sha256(dumps(sorted(names)))[7:]


ENV_DIGEST = "env-hmac:"
"""Prefix of a keyed environment digest: ``env-hmac:<16 hex key id>:<64 hex>``."""

LEGACY_ENV_DIGEST = "hmac-sha256:"
"""Prefix of an environment digest keyed by the task's salt alone (written before the environment
key; still compared, never written)."""

CANNOT_COMPARE = "cannot compare"
"""What an environment digest compares as when this machine lacks the key it was made with."""


def _env_msg(name: str, value: str) -> bytes:
    return name.encode("utf-8", "surrogateescape") + b"\0" + value.encode("utf-8", "surrogateescape")


def _keyed_with(k: EnvKey, salt: bytes, name: str, value: str) -> str:
    task_key = hmac.new(k.key, b"overnight.env/1\0" + salt, hashlib.sha256).digest()
    return f"{ENV_DIGEST}{k.key_id}:" + hmac.new(task_key, _env_msg(name, value), hashlib.sha256).hexdigest()


def keyed(salt: bytes, name: str, value: str | None) -> str:
    """Keyed digest of an environment variable's value (``"unset"`` when not set), with this
    machine's environment key (created on first use) and the task's ``salt``.

    Raises:
        OSError: the per-user key file cannot be read or created.
    """
    if value is None:
        return UNSET
    return _keyed_with(env_key(create=True), salt, name, value)


def keyed_like(recorded: Any, salt: bytes, name: str, value: str | None) -> str:
    """The digest of ``value`` now in the scheme of ``recorded``, so the two compare: the legacy
    salt-only digest for a legacy one; :data:`CANNOT_COMPARE` for one made with an environment
    key this machine does not have (unless the variable is now unset: that is a change); else
    :func:`keyed`."""
    if value is None:
        return UNSET
    if isinstance(recorded, str) and recorded.startswith(LEGACY_ENV_DIGEST):
        return LEGACY_ENV_DIGEST + hmac.new(salt, _env_msg(name, value), hashlib.sha256).hexdigest()
    if isinstance(recorded, str) and recorded.startswith(ENV_DIGEST):
        k = env_key(create=False)
        if k is None or recorded[len(ENV_DIGEST):].split(":", 1)[0] != k.key_id:
            return CANNOT_COMPARE
        return _keyed_with(k, salt, name, value)
    return keyed(salt, name, value)


def runtime() -> dict[str, str]:
    """Python version and implementation, and the platform."""
    return {"python": platform.python_version(), "implementation": platform.python_implementation(),
            "platform": platform.platform()}


def find_lock_files(root: Path) -> list[Path]:
    """Lock files in ``root`` (not recursive)."""
    out = [root / n for n in LOCK_FILES if (root / n).is_file()]
    for pattern in LOCK_GLOBS:
        out += sorted(p for p in root.glob(pattern) if p.is_file())
    return out


@dataclass
class WorldSpec:
    """What a task declares about the world it depends on (see :class:`~overnight.Task`).

    Attributes:
        version: the task's code epoch.
        steps: ``fn name -> (version, source digest or None)``.
        deps: distribution names to record, or ``"all"``.
        env: environment variable names to record (as keyed digests).
        inputs: files or directories to record.
        sources: ``name -> callable`` returning ``str``/``bytes`` whose digest is recorded.
        exports: ``artifact name -> file path`` the runner keeps in sync with committed artifacts.
        root: project directory where lock files are looked for.
        salt: per-task key for environment digests.
        model: :func:`model_identity` of the model steps call, or None (not known: recorded
            as null, compared as ``not recorded``).
        paths: records ``inputs`` under the key :meth:`~overnight.verify.input_paths.
            ProjectPaths.key` gives (relative to the project root inside it); None: as given.
    """

    version: str = "1"
    steps: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    deps: list[str] | str = "all"
    env: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    sources: dict[str, Callable[[], Any]] = field(default_factory=dict)
    exports: dict[str, str] = field(default_factory=dict)
    root: Path = field(default_factory=Path.cwd)
    salt: bytes = b""
    model: dict[str, Any] | None = None
    paths: Any = None


def model_identity(spec: str, *, name: str | None = None, base_url: str | None = None,
                   tokenizer: str | None = None) -> dict[str, Any]:
    """The ``model`` component: ``{"spec", "name", "base_url", "tokenizer"}``.

    Args:
        spec: the model spec (``extractive``, ``local``, ``openai:gpt-4o-mini``).
        name: the model's own name (an ``openai:`` model's NAME, a GGUF file's name); default:
            the spec after its kind.
        base_url: the endpoint of an ``openai:`` model (user and password, if any, removed).
        tokenizer: the name of the tokenizer that counts its tokens.
    """
    if base_url:
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(base_url)
        if parts.username or parts.password:
            base_url = urlunsplit(parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")))
    kind, _, rest = spec.partition(":")
    return {"spec": spec, "name": name or (Path(rest).name if kind == "local" and rest else rest or spec),
            "base_url": base_url or None, "tokenizer": tokenizer}


def model_label(identity: dict[str, Any] | None) -> str:
    """One line for a drift report: ``openai:m (name m, base URL http://..., tokenizer o200k_base)``;
    ``"not recorded"`` for None."""
    if not identity:
        return NOT_RECORDED
    extra = [f"name {identity['name']}"] if identity.get("name") not in (None, identity["spec"]) else []
    extra += [f"base URL {identity['base_url']}"] if identity.get("base_url") else []
    extra += [f"tokenizer {identity['tokenizer']}"] if identity.get("tokenizer") else []
    return identity["spec"] + (f" ({', '.join(extra)})" if extra else "")


def source_digest(fn: Callable[[], Any], name: str) -> str:
    """Call a registered input source and digest what it returns."""
    try:
        value = fn()
    except Exception as exc:  # noqa: BLE001 - the user's callable; report it, typed
        raise ConfigError(f"input source {name!r} failed: {type(exc).__name__}: {exc}") from exc
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogatepass")
    if not isinstance(value, (bytes, bytearray)):
        value = dumps(value if value is None or isinstance(value, (int, float, bool, list, dict)) else str(value))
    return digest.sha256(value)


def world(spec: WorldSpec) -> dict[str, Any]:
    """The fingerprint of the world now (everything but ``artifacts``, which come from a state).

    Shape: ``{"format": 2, "code": {"task", "steps": {fn: {"version", "source"}}}, "deps":
    {"packages": {name: version}, "locks": {file: digest}}, "env": {"python", "implementation",
    "platform", "vars": {name: keyed digest}}, "inputs": {path (relative to the project root inside
    it, with ``spec.paths``) or source name: digest},
    "model": {"spec", "name", "base_url", "tokenizer"} or null}``.
    """
    return {
        "format": WORLD_FORMAT,
        "code": {"task": spec.version,
                 "steps": {n: {"version": v, "source": s} for n, (v, s) in sorted(spec.steps.items())}},
        "deps": {"packages": installed(None if spec.deps == "all" else list(spec.deps)),
                 "locks": {p.name: digest_path(p) for p in find_lock_files(spec.root)}},
        "env": {**runtime(), "vars": {n: keyed(spec.salt, n, os.environ.get(n)) for n in sorted(spec.env)}},
        "inputs": {**{(spec.paths.key(p) if spec.paths is not None else str(p)): digest_path(p)
                      for p in sorted(spec.inputs)},
                   **{f"source:{n}": source_digest(fn, n) for n, fn in sorted(spec.sources.items())}},
        "model": spec.model,
    }


def pip_requirements(fp: dict[str, Any], step_env: Iterable[str] = ()) -> str:
    """A pip requirements file recreating a recorded ``deps`` component (for ``env export``);
    ``step_env`` names the environment variables steps read (``ctx.env``), listed as comments."""
    lines = [f"# written by overnight env export: python {fp['env']['python']} "
             f"({fp['env']['implementation']}) on {fp['env']['platform']}"]
    for name, d in sorted(fp["deps"]["locks"].items()):
        lines.append(f"# lock file {name}: {d}")
    if fp["env"]["vars"]:
        lines.append("# environment variables the task declared (values not recorded): "
                     + ", ".join(sorted(fp["env"]["vars"])))
    read = sorted(set(step_env) - set(fp["env"]["vars"]))
    if read:
        lines.append("# environment variables its steps read (values not recorded): " + ", ".join(read))
    for name, version in sorted(fp["deps"]["packages"].items()):
        if name in NOT_PINNED:  # the installer and overnight itself: pinning them would fight the venv
            lines.append(f"# {name}=={version} (not pinned)")
        else:
            lines.append(f"{name}=={version}" if version != MISSING else f"# {name}: not installed")
    return "\n".join(lines) + "\n"


