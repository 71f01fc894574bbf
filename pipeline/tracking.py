"""MLflow tracking location: `tracking.uri` in params, then $MLFLOW_TRACKING_URI, then the embedded sqlite store."""

from __future__ import annotations

import os
import sqlite3
import urllib.error
import urllib.request
from pathlib import Path

from pipeline.config.tracking_config import TrackingConfig
from pipeline.errors import DraftlineError, redact_url

SERVER_PROBE_TIMEOUT_S = 5.0
SQLITE_HEADER = b"SQLite format 3\x00"
SQLITE_BUSY_TIMEOUT_S = 5.0
MLFLOW_TABLES = {"experiments", "runs", "alembic_version"}
# A checkpoint's content identity (pipeline.lineage.model_identity) on the MLflow run that trained it and on
# the registry version that holds it: the drafter artifact names no run id, so its bytes stay reproducible
TAG_MODEL_IDENTITY = "draftline.model_identity"
TAG_STAGE = "draftline.stage"


def tracking_uri(tracking: TrackingConfig, base: Path | str = ".") -> str:
    if tracking.uri:
        return tracking.uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{(Path(base) / 'mlflow.db').resolve()}"


def sqlite_path(uri: str) -> Path | None:
    return Path(uri.removeprefix("sqlite:///")).resolve() if uri.startswith("sqlite:///") else None


def sqlite_artifact_root(uri: str) -> str | None:
    """Artifacts of an embedded sqlite store live next to the database file, not in the cwd."""
    database = sqlite_path(uri)
    return str(database.parent / "mlruns") if database else None


def checked_tracking_uri(tracking: TrackingConfig, base: Path | str = ".") -> str:
    """The tracking URI for a stage that writes runs or artifacts (train, promote), checked first: the store
    itself (`check_store`), and a project's own store kept inside the project. The default sqlite store and
    its `mlruns/` must resolve inside `base`: after a copy, a `mlflow.db` or `mlruns` symlinked to the
    original's, or the experiment's recorded artifact location (MLflow stores it absolute), would send this
    project's runs into the original's. A store that tracking.uri or $MLFLOW_TRACKING_URI puts elsewhere is
    elsewhere on purpose, and promotion.json records its URI."""
    uri = tracking_uri(tracking, base)
    check_store(uri)
    database = sqlite_path(uri)
    if database is None:  # a server or database: where its artifacts go is the server's configuration
        return uri
    project = Path(base).resolve()
    artifacts = Path(sqlite_artifact_root(uri)).resolve()
    outside = [f"{what} {path}" for what, path in (("store", database), ("artifact dir", artifacts))
               if not path.is_relative_to(project)]
    configured = bool(tracking.uri or os.environ.get("MLFLOW_TRACKING_URI"))
    if outside and not configured:
        raise DraftlineError(f"the MLflow {' and '.join(outside)} resolve outside this project {project} (a symlink "
                             "to another project's?), which would receive this project's runs; remove the link (a "
                             "fresh store is made here), or set tracking.uri to it if you mean it")
    location = _experiment_location(database, tracking.experiment)
    if location is not None:
        check_artifact_location(uri, tracking.experiment, location)
    return uri


def _experiment_location(database: Path, experiment: str) -> str | None:
    """The artifact location the store records for `experiment`, read without MLflow; None if there is none yet."""
    if not database.is_file():
        return None
    connection = _connect_existing(database)
    try:
        row = connection.execute("SELECT artifact_location FROM experiments WHERE name = ?", (experiment,)).fetchone()
    except sqlite3.Error:  # no tables yet: MLflow creates them, and the experiment, where the URI says
        return None
    finally:
        connection.close()
    return row[0] if row else None


def _connect_existing(database: Path) -> sqlite3.Connection:
    """The store opened to be read, never created. Read-write, not read-only: a writer killed mid-transaction
    (a SIGKILLed training run) leaves a hot journal that SQLite must roll back on the next open, and a
    read-only connection refuses that with "attempt to write a readonly database"."""
    return sqlite3.connect(f"{database.as_uri()}?mode=rw", uri=True, timeout=SQLITE_BUSY_TIMEOUT_S)


def check_artifact_location(uri: str, experiment: str, location: str) -> None:
    """MLflow stores an absolute artifact path per experiment: after the project (and its mlflow.db) is
    copied or moved, new runs would write into the old place's mlruns/."""
    expected = sqlite_artifact_root(uri)
    if expected is None or "://" in location.removeprefix("file://"):
        return
    actual = Path(location.removeprefix("file://")).resolve()
    if not actual.is_relative_to(Path(expected).resolve()):  # MLflow may add the experiment id: mlruns/<id>
        raise DraftlineError(
            f"MLflow experiment '{experiment}' keeps artifacts in {actual}, not next to {sqlite_path(uri)} "
            f"(the project was moved or copied); set tracking.experiment to a new name to start a fresh "
            f"experiment here, or run from the original location"
        )


def check_store(uri: str) -> None:
    """Every entry point that touches MLflow (train, promote, the registry CLI) calls this first: an empty,
    foreign or damaged sqlite file is refused before MLflow turns it into a new registry (or adds its
    tables to someone else's database), a locked one is reported as the transient state it is, and a
    server that does not answer fails within seconds instead of a minutes-long retry loop."""
    database = sqlite_path(uri)
    if database is not None and database.exists():
        _check_sqlite_store(database)
    _check_database_driver(uri)
    if uri.startswith(("http://", "https://")):
        try:
            urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=SERVER_PROBE_TIMEOUT_S).close()
        except (urllib.error.URLError, OSError, ValueError) as error:
            reason = getattr(error, "reason", error)
            raise DraftlineError(
                f"MLflow tracking server {redact_url(uri)} is not reachable ({reason}); start it, or fix "
                "tracking.uri / $MLFLOW_TRACKING_URI"
            ) from None


# MLflow's database stores (sqlalchemy URLs); any other scheme is a server or a file store
DATABASE_SCHEMES = ("postgresql", "mysql", "mssql", "sqlite")


def _check_database_driver(uri: str) -> None:
    """A database URI needs its Python driver (`postgresql://` → psycopg2): without it MLflow fails with a
    ModuleNotFoundError traceback from deep inside sqlalchemy."""
    if uri.split(":", 1)[0].split("+", 1)[0] not in DATABASE_SCHEMES:
        return
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        make_url(uri).get_dialect().import_dbapi()
    except (ImportError, NoSuchModuleError, ArgumentError) as error:
        missing = getattr(error, "name", None) or str(error).splitlines()[0]
        raise DraftlineError(f"tracking URI {redact_url(uri)} needs the database driver '{missing}', which is not "
                             "installed in this environment; install the package that provides it (or name another driver: "
                             "`postgresql+<driver>://`), or use tracking.uri: sqlite:///mlflow.db") from None


def _check_sqlite_store(database: Path) -> None:
    if not database.is_file():
        raise DraftlineError(f"MLflow store {database} is not a file; point tracking.uri at an sqlite file")
    with database.open("rb") as handle:
        header = handle.read(len(SQLITE_HEADER))
    if not header:
        raise DraftlineError(
            f"MLflow store {database} is empty (0 bytes), so its registry history is gone; restore it from a "
            "backup, or delete the file to start a new, empty registry"
        )
    if header != SQLITE_HEADER:
        raise DraftlineError(
            f"MLflow store {database} is not an SQLite database (corrupt or another file); restore it from a "
            "backup, or move it away to start a new, empty registry"
        )
    try:
        connection = _connect_existing(database)
        try:
            tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            connection.close()
    except sqlite3.OperationalError as error:
        if "locked" in str(error) or "busy" in str(error):
            raise DraftlineError(
                f"MLflow store {database} is locked by another process ({error}); its registry is intact: wait for "
                "that process to finish and rerun"
            ) from None
        raise DraftlineError(f"MLflow store {database} is unreadable ({error}); restore it from a backup") from None
    except sqlite3.DatabaseError as error:
        raise DraftlineError(f"MLflow store {database} is damaged ({error}); restore it from a backup") from None
    if tables and not MLFLOW_TABLES <= tables:
        raise DraftlineError(
            f"MLflow store {database} is an SQLite database of something else (tables: "
            f"{', '.join(sorted(tables)[:5])}); point tracking.uri at MLflow's own database"
        )
