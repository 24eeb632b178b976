"""Configuration: ``overnight.toml``, environment variables, defaults -- and where each value came from.

Precedence (highest first): an explicit argument (CLI option), an environment variable, the
project file (``$OVERNIGHT_CONFIG``, else the first ``overnight.toml`` in the current directory
or a parent), the built-in default. ``overnight config`` prints the effective values with their
sources. The signing key is never printed, only whether it is set.

``overnight.toml``::

    [store]
    url = "sqlite://.overnight/overnight.db"     # the default store (also media.local)

    [media]                                      # storage media the router can choose
    database = "postgresql://127.0.0.1:5432/test"
    cloud = "s3://bucket/prefix?endpoint_url=http://127.0.0.1:9000"

    [criticality]                                # media each criticality requires
    normal = ["local"]
    important = ["database"]
    critical = ["database", "cloud"]

    [router]
    session_hours = 2.0      # span below this (and not overnight): ephemeral
    durable_hours = 24.0     # span above this, or crossing a night: durable
    min_completeness = 0.3   # specs less complete than this are refused

    [lease]
    ttl_ms = 30000

    [prices]                 # USD per million tokens [input, output], for cost estimates
    "openai:gpt-4o-mini" = [0.15, 0.60]
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from overnight.errors import ConfigError

DEFAULT_STORE = "sqlite://.overnight/overnight.db"

DEFAULTS: dict[str, Any] = {
    "store.url": DEFAULT_STORE,
    "media.local": None,  # None: same as store.url
    "media.database": None,
    "media.cloud": None,
    "criticality.normal": ["local"],
    "criticality.important": ["database"],
    "criticality.critical": ["database", "cloud"],
    "router.session_hours": 2.0,
    "router.durable_hours": 24.0,
    "router.min_completeness": 0.3,
    "lease.ttl_ms": 30_000,
    "signing.key": None,
}

ENV = {
    "store.url": "OVERNIGHT_STORE",
    "media.local": "OVERNIGHT_MEDIA_LOCAL",
    "media.database": "OVERNIGHT_MEDIA_DATABASE",
    "media.cloud": "OVERNIGHT_MEDIA_CLOUD",
    "signing.key": "OVERNIGHT_SIGNING_KEY",
}

SECRET = {"signing.key"}


@dataclass
class Config:
    """Effective configuration: ``values[key]`` and ``sources[key]`` (``default``, a file path, or
    ``$ENV_VAR``)."""

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    file: Path | None = None

    def get(self, key: str) -> Any:
        return self.values[key]

    def medium(self, name: str) -> str | None:
        """URL of a storage medium by name (``local``, ``database``, ``cloud``), None if unset."""
        if name == "local":
            return self.values["media.local"] or self.values["store.url"]
        return self.values.get(f"media.{name}")

    def price(self, model: str) -> tuple[float, float] | None:
        """``(input, output)`` USD per million tokens for ``model``, when configured."""
        value = self.values.get(f"prices.{model}")
        return (value[0], value[1]) if value else None

    def shown(self) -> list[tuple[str, str, str]]:
        """``(key, value, source)`` rows for ``overnight config`` (secrets as set/unset)."""
        rows = []
        for key in [*DEFAULTS, *sorted(k for k in self.values if k.startswith("prices."))]:
            value = self.values[key]
            if key in SECRET:
                text = "(set)" if value else "(unset)"
            elif value is None:
                text = "(same as store.url)" if key == "media.local" else "(not configured)"
            elif key in STORE_KEYS:
                text = mask_password(str(value))
            else:
                text = ", ".join(map(str, value)) if isinstance(value, list) else str(value)
            rows.append((key, text, self.sources[key]))
        from overnight.keys import env_key_path, signing_key_from_env, state_dir

        # kept outside every store (overnight.keys): where, never the key itself
        path = env_key_path()
        if signing_key_from_env() is not None:
            rows.append(("env_key", "the signing key", "OVERNIGHT_SIGNING_KEY"))
        else:
            rows.append(("env_key", f"{path}{'' if path.exists() else ' (created on first use)'}",
                         "OVERNIGHT_ENV_KEY_FILE" if os.environ.get("OVERNIGHT_ENV_KEY_FILE") else "default"))
        rows.append(("high_water", str(state_dir() / "high-water.json"),
                     "OVERNIGHT_STATE_DIR" if os.environ.get("OVERNIGHT_STATE_DIR") else "default"))
        return rows


def find_file(start: Path | None = None) -> Path | None:
    """``$OVERNIGHT_CONFIG``, else the first ``overnight.toml`` in ``start`` (cwd) or a parent."""
    explicit = os.environ.get("OVERNIGHT_CONFIG")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise ConfigError(f"OVERNIGHT_CONFIG names {path}, which does not exist")
        return path
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / "overnight.toml"
        if candidate.is_file():
            return candidate
    return None


STORE_KEYS = ("store.url", "media.local", "media.database", "media.cloud")


def mask_password(url: str) -> str:
    """``scheme://user:PASSWORD@host/...`` and ``...?password=PASSWORD`` (a libpq parameter) with
    the password shown as ``***`` (for messages)."""
    return re.sub(r"(?i)([?&;]password=)[^&;]*", r"\1***", re.sub(r"^([^/]*//[^/@:]*:)[^/@]*@", r"\1***@", url))


def _anchored(url: str, folder: Path) -> str:
    """A store URL from a config file: a relative ``sqlite://`` or ``file://`` path (or a bare
    path) is relative to the file's folder, not to wherever a command runs."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url if Path(url).is_absolute() else str(folder / url)
    if scheme.lower() in ("sqlite", "file") and rest and not Path(rest).is_absolute() and rest[0] not in "~:":
        return f"{scheme}://{(folder / rest).as_posix()}"
    return url


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


_SCHEMES = ("sqlite", "file", "postgresql", "postgres", "s3", "memory")
_MEDIA = ("local", "database", "cloud")


def _store_url(value: str | None) -> str | None:
    """A store URL's form (scheme and a path or host), as :func:`overnight.store.open_store` takes it."""
    if value is None:
        return None
    scheme, sep, rest = value.partition("://")
    if not sep:
        if Path(value).suffix in (".db", ".sqlite", ".sqlite3"):
            return value
        raise ConfigError("must be a store URL (sqlite://PATH, file://DIR, postgresql://HOST/DB?schema=NAME, "
                         "s3://BUCKET/PREFIX) or a path ending in .db")
    if scheme.lower() not in _SCHEMES:
        raise ConfigError(f"has scheme {scheme!r}; use one of {', '.join(s + '://' for s in _SCHEMES)}")
    if not rest:
        raise ConfigError("names no path, host or bucket after the scheme")
    return value


class Settings(BaseModel):
    """The checked form of every setting (keys as in ``overnight.toml``). Each constraint is the
    range in which the setting means something: a span threshold is a positive number of hours and
    the durable threshold is above the session one (:mod:`overnight.runtime.router`), a
    completeness is a share in [0, 1], a lease lives at least 1 s (it is renewed every third of
    its TTL), a store URL has a scheme :func:`overnight.store.open_store` knows."""

    model_config = ConfigDict(extra="forbid")

    store_url: str = Field(alias="store.url")
    media_local: str | None = Field(None, alias="media.local")
    media_database: str | None = Field(None, alias="media.database")
    media_cloud: str | None = Field(None, alias="media.cloud")
    criticality_normal: list[str] = Field(alias="criticality.normal", min_length=1)
    criticality_important: list[str] = Field(alias="criticality.important", min_length=1)
    criticality_critical: list[str] = Field(alias="criticality.critical", min_length=1)
    router_session_hours: float = Field(alias="router.session_hours", gt=0, allow_inf_nan=False)
    router_durable_hours: float = Field(alias="router.durable_hours", gt=0, allow_inf_nan=False)
    router_min_completeness: float = Field(alias="router.min_completeness", ge=0, le=1)
    lease_ttl_ms: int = Field(alias="lease.ttl_ms", ge=1000, le=7 * 24 * 3600 * 1000, strict=True)
    signing_key: str | None = Field(None, alias="signing.key", min_length=1)

    @field_validator("store_url", "media_local", "media_database", "media_cloud")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return _store_url(value)

    @field_validator("criticality_normal", "criticality_important", "criticality_critical")
    @classmethod
    def _media(cls, value: list[str]) -> list[str]:
        unknown = [m for m in value if m not in _MEDIA]
        if unknown:
            raise ConfigError(f"names unknown media {unknown}; use {', '.join(_MEDIA)}")
        return value

    @model_validator(mode="after")
    def _spans(self) -> "Settings":
        if self.router_durable_hours < self.router_session_hours:
            raise ConfigError(f"router.durable_hours ({self.router_durable_hours:g}) must not be below "
                             f"router.session_hours ({self.router_session_hours:g})")
        return self


def _check(cfg: Config) -> None:
    """Validate the merged values with :class:`Settings`; a bad one is a ConfigError naming the
    key, the value and where it came from (the file, or the environment variable)."""
    values = {k: v for k, v in cfg.values.items() if not k.startswith("prices.")}
    try:
        Settings.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = str(err["loc"][0]) if err["loc"] else ""
        if not key:  # the rule between the two span thresholds: name the one that was set
            set_here = [k for k in ("router.session_hours", "router.durable_hours") if cfg.sources[k] != "default"]
            key = set_here[0] if set_here else "router.durable_hours"
        shown = "(set)" if key in SECRET else repr(cfg.values.get(key))
        source = cfg.sources.get(key, "default")
        where = f"{source}: " if source != "default" else ""
        message = str(err["msg"]).removeprefix("Value error, ")
        raise ConfigError(f"{where}{key} = {shown}: {message}",
                          hint=f"fix {key} in {source}" if source != "default" else
                          "see `overnight config` for the effective values and their sources") from None


def load(start: Path | None = None) -> Config:
    """Read the effective configuration. With an ``overnight.toml`` that sets no ``store.url``, the
    default store is beside that file (``.overnight/overnight.db`` in the project root), so every
    command run anywhere in the project reaches the same store, as task code is recorded relative
    to that root; without a file it is relative to the current directory.

    Raises:
        ConfigError: the file is not valid TOML, or names an unknown key, or a value of the wrong
            type or out of its range (:class:`Settings`), naming the key, the value and its source.
    """
    cfg = Config(dict(DEFAULTS), {k: "default" for k in DEFAULTS})
    path = find_file(start)
    if path is not None:
        import tomllib  # only with a file to read (2-3 ms of a start-up without one)

        try:
            data = _flatten(tomllib.loads(path.read_text(encoding="utf-8")))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
        for key, value in data.items():
            if key.startswith("prices."):
                if not (isinstance(value, list) and len(value) == 2 and all(isinstance(x, (int, float)) for x in value)):
                    raise ConfigError(f"{path}: {key} must be [input, output] USD per million tokens")
                cfg.values[key] = [float(x) for x in value]
                cfg.sources[key] = str(path)
                continue
            if key not in DEFAULTS:
                raise ConfigError(f"{path}: unknown setting {key!r}", hint=f"known: {', '.join(DEFAULTS)}")
            default = DEFAULTS[key]
            if isinstance(default, list) and not (isinstance(value, list) and all(isinstance(x, str) for x in value)):
                raise ConfigError(f"{path}: {key} must be a list of media names")
            if isinstance(default, float) and not isinstance(value, (int, float)):
                raise ConfigError(f"{path}: {key} must be a number")
            if key in STORE_KEYS and isinstance(value, str):
                value = _anchored(value, path.parent)
            cfg.values[key] = float(value) if isinstance(default, float) else value
            cfg.sources[key] = str(path)
        cfg.file = path
        if cfg.sources["store.url"] == "default":  # the project's store, wherever in it a command runs
            cfg.values["store.url"] = _anchored(DEFAULT_STORE, path.parent)
    for key, var in ENV.items():
        if os.environ.get(var):
            cfg.values[key] = os.environ[var]
            cfg.sources[key] = f"${var}"
    _check(cfg)
    return cfg
