"""Local servers for tracking at scale: a PostgreSQL cluster and an MLflow tracking server backed by it, both bound
to 127.0.0.1 (docs/threat-model.md). ``ragen services mlflow`` runs them in the foreground; the integration test and the
recipe in infra/mlflow/ use the same classes. On a cluster, point ``tracking.mlflow_tracking_uri`` at the shared
server instead and leave ``tracking.mlflow_artifact_location`` null (the server stores artifacts).

PostgreSQL refuses to run as root: under root the cluster's commands run as the ``postgres`` system user (which
Debian's package creates) and the data directory is handed to it."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PG_USER = "ragen"
PG_DB = "mlflow"


def prefect_home_env(home: Path) -> dict[str, str]:
    """Variables that put all of Prefect's own files under ``home``. PREFECT_HOME alone is not enough in prefect
    3.7: the server's memo store and the local result storage default to ~/.prefect whatever it says. (Here, not
    beside the Prefect server in flows/serve.py, so that the test session can set them before prefect is imported.)"""
    return {"PREFECT_HOME": str(home), "PREFECT_SERVER_MEMO_STORE_PATH": str(Path(home) / "memo_store.toml"),
            "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(Path(home) / "storage")}


class ServiceError(RuntimeError):
    """A local server could not be found, started or reached; the message names the fix."""


def free_port() -> int:
    from ragen.train.ds import free_port as free

    return free()


def pg_bin(name: str) -> str:
    """A PostgreSQL server program: on PATH, else the newest /usr/lib/postgresql/<version>/bin (Debian's layout)."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name)
                      if p.parent.name.isdigit() else 0)
    for d in reversed(versions):
        if (d / name).is_file():
            return str(d / name)
    raise ServiceError(f"PostgreSQL's {name} was not found: install the server (Debian/Ubuntu: "
                       f"`apt-get install postgresql`; .ci/run does) or put its bin/ directory on PATH")


class Service:
    """A server this process starts and stops: ``with X(...) as x:`` starts it, and stops it on leaving (also when
    starting fails half-way)."""

    def start(self) -> Service:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def healthy(url: str, timeout: float = 2.0) -> bool:
    """Whether ``url``/health answers 200 (Prefect's API and the MLflow server both have it)."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


def _as_owner(args: list[str]) -> list[str]:
    """Run as the postgres system user when this process is root (PostgreSQL refuses root)."""
    if os.geteuid() != 0:
        return args
    if shutil.which("runuser") is None:
        raise ServiceError("running as root and `runuser` is missing: start PostgreSQL as a non-root user")
    return ["runuser", "-u", "postgres", "--", *args]


@dataclass
class LocalPostgres(Service):
    """A throw-away (or kept) PostgreSQL cluster in ``data_dir`` on 127.0.0.1:``port``, with a database ``db``
    owned by ``user``. Password authentication (SCRAM) on loopback and the socket: the password is made on first
    use and kept beside the data directory (``<data_dir>.password``, mode 0600); clients get it from ``client_env``
    (libpq's PGPASSWORD), never in a URL or on a command line. ``with LocalPostgres(dir) as pg: pg.url``."""

    data_dir: Path
    port: int = field(default_factory=free_port)
    user: str = PG_USER
    db: str = PG_DB
    startup_timeout: float = 60.0

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the database (MLflow's --backend-store-uri), without the password."""
        return f"postgresql+psycopg2://{self.user}@127.0.0.1:{self.port}/{self.db}"

    @property
    def log(self) -> Path:
        return self.data_dir / "server.log"

    @property
    def password_file(self) -> Path:
        return self.data_dir.with_name(self.data_dir.name + ".password")

    @property
    def password(self) -> str:
        """The superuser's password: made on first use; a file already there is used only when it is this user's
        own, private (0600) and not a link (else anyone who made it first would choose the password)."""
        f = self.password_file
        f.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_urlsafe(24))
        try:
            fd = os.open(f, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as e:  # ELOOP: a symbolic link
            raise ServiceError(f"PostgreSQL password file {f} cannot be opened safely ({e.strerror}): it must be a "
                               f"plain file; delete it (and the data directory {self.data_dir} if it is not "
                               f"yours) and start again") from None
        with os.fdopen(fd) as src:
            st = os.fstat(src.fileno())
            if st.st_uid != os.geteuid() or st.st_mode & 0o077 or not stat.S_ISREG(st.st_mode):
                raise ServiceError(f"PostgreSQL password file {f} is not this user's private file (owner uid "
                                   f"{st.st_uid}, mode {oct(st.st_mode & 0o777)}; it must be uid {os.geteuid()}, "
                                   f"0600): someone else may have chosen the password. Delete it and the data "
                                   f"directory {self.data_dir}, or `chmod 600` it if you made it yourself")
            return src.read().strip()

    @property
    def client_env(self) -> dict[str, str]:
        """Environment for a process that connects to the database (e.g. ``mlflow server``)."""
        return {"PGPASSWORD": self.password}

    def _postgres_user(self) -> Any:
        import pwd

        try:
            return pwd.getpwnam("postgres")
        except KeyError:
            raise ServiceError("running as root and there is no `postgres` system user (Debian's postgresql "
                               "package creates it): install the package or run as a non-root user") from None

    def _owned(self) -> None:
        """Under root, hand the data directory to the ``postgres`` user. Directories above it are left as they
        are: one the server cannot pass through is an error naming it, not a chmod outside the project."""
        if os.geteuid() != 0:
            return
        pw = self._postgres_user()
        if self.data_dir.is_symlink():
            raise ServiceError(f"PostgreSQL data directory {self.data_dir} is a symbolic link: under root its "
                               f"files are handed to the `postgres` user, so it must be a real directory; "
                               f"choose another path or replace the link")
        for top, dirs, files in os.walk(self.data_dir):  # links are handed over as links, never followed
            for name in [top, *(os.path.join(top, n) for n in dirs + files)]:
                os.chown(name, pw.pw_uid, pw.pw_gid, follow_symlinks=False)
        for parent in self.data_dir.resolve().parents:
            if not parent.stat().st_mode & 0o001:
                raise ServiceError(f"PostgreSQL runs as the `postgres` user, which cannot reach {self.data_dir}: "
                                   f"{parent} is closed to other users. Choose a data directory under a path it "
                                   f"can pass through (e.g. --postgres /var/tmp/ragen-pg), or allow it yourself "
                                   f"(`chmod o+x {parent}`)")

    def _initdb(self) -> None:
        """A new cluster whose superuser ``user`` has the password (initdb reads it from a file the server's user
        can read, removed right after)."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="ragen-pg-init-") as tmp:
            pwfile = Path(tmp) / "pw"
            pwfile.write_text(self.password + "\n")
            pwfile.chmod(0o600)
            if os.geteuid() == 0:
                pw = self._postgres_user()
                for f in (Path(tmp), pwfile):
                    os.chown(f, pw.pw_uid, pw.pw_gid, follow_symlinks=False)
            self._run([pg_bin("initdb"), "-D", str(self.data_dir), "-U", self.user, "--auth=scram-sha-256",
                       f"--pwfile={pwfile}", "-E", "UTF8", "--no-instructions"], "initdb")

    def _hba(self) -> Path:
        return self.data_dir / "pg_hba.conf"

    @staticmethod
    def _trusts(line: str) -> bool:
        """A pg_hba.conf rule (not a comment) whose method is ``trust``."""
        return not line.lstrip().startswith("#") and line.split()[-1:] == ["trust"]

    def _trusting(self) -> bool:
        """A cluster made by an earlier version of this file (``--auth=trust``)."""
        return any(self._trusts(ln) for ln in self._hba().read_text().splitlines())

    def _require_passwords(self) -> None:
        """Give an old trust-authenticated cluster the password and switch it to SCRAM (it is running)."""
        import psycopg2
        from psycopg2 import sql

        con = psycopg2.connect(host="127.0.0.1", port=self.port, user=self.user, dbname="postgres")
        try:
            con.autocommit = True
            with con.cursor() as cur:
                cur.execute(sql.SQL("ALTER ROLE {} PASSWORD %s").format(sql.Identifier(self.user)), (self.password,))
        finally:
            con.close()
        lines = [ln.rsplit("trust", 1)[0] + "scram-sha-256" if self._trusts(ln) else ln
                 for ln in self._hba().read_text().splitlines()]
        self._hba().write_text("\n".join(lines) + "\n")
        self._run([pg_bin("pg_ctl"), "-D", str(self.data_dir), "reload"], "reload")

    def _run(self, args: list[str], what: str) -> subprocess.CompletedProcess:
        r = subprocess.run(_as_owner(args), capture_output=True, text=True, timeout=self.startup_timeout)
        if r.returncode:
            tail = (r.stderr or r.stdout).strip()[-1500:]
            hint = f"; server log: {self.log}" if self.log.exists() else ""
            raise ServiceError(f"PostgreSQL {what} failed (exit {r.returncode}): {tail}{hint}")
        return r

    def start(self) -> LocalPostgres:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._owned()
        if not (self.data_dir / "PG_VERSION").is_file():
            self._initdb()
        self._run([pg_bin("pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log), "-w",
                   "-t", str(int(self.startup_timeout)), "-o",
                   f"-p {self.port} -k {self.data_dir} -c listen_addresses=127.0.0.1", "start"], "start")
        if self._trusting():
            self._require_passwords()
        self._create_db()
        return self

    def _create_db(self) -> None:
        import psycopg2

        con = psycopg2.connect(host="127.0.0.1", port=self.port, user=self.user, dbname="postgres",
                               password=self.password)
        try:
            con.autocommit = True
            with con.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.db,))
                if cur.fetchone() is None:
                    cur.execute(f'CREATE DATABASE "{self.db}"')
        finally:
            con.close()

    def query(self, sql: str) -> list[tuple]:
        import psycopg2

        con = psycopg2.connect(host="127.0.0.1", port=self.port, user=self.user, dbname=self.db,
                               password=self.password)
        try:
            with con.cursor() as cur:
                cur.execute(sql)
                return cur.fetchall()
        finally:
            con.close()

    def stop(self) -> None:
        if (self.data_dir / "postmaster.pid").is_file():
            with contextlib.suppress(ServiceError, subprocess.TimeoutExpired):
                self._run([pg_bin("pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "stop"], "stop")


@dataclass
class LocalMLflowServer(Service):
    """``mlflow server`` on 127.0.0.1:``port`` over ``backend`` (a database URL), storing artifacts under
    ``artifacts`` and serving them to clients (artifact proxy: clients need no direct access to the store)."""

    backend: str
    artifacts: Path
    port: int = field(default_factory=free_port)
    log: Path | None = None
    startup_timeout: float = 120.0
    env: dict[str, str] = field(default_factory=dict)  # e.g. LocalPostgres.client_env
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LocalMLflowServer:
        if healthy(self.url):
            raise ServiceError(f"something already answers on {self.url}: stop it or choose another port")
        self.artifacts.mkdir(parents=True, exist_ok=True)
        log = self.log or self.artifacts.parent / "mlflow-server.log"
        mlflow = Path(sys.executable).with_name("mlflow")
        args = [str(mlflow) if mlflow.exists() else "mlflow", "server", "--backend-store-uri", self.backend,
                "--artifacts-destination", str(self.artifacts.resolve()), "--host", "127.0.0.1",
                "--port", str(self.port), "--workers", "1"]
        with log.open("ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**os.environ, **self.env})
        t0 = time.monotonic()
        while not healthy(self.url):
            if self.proc.poll() is not None:
                raise ServiceError(f"mlflow server exited with code {self.proc.returncode}; see {log}")
            if time.monotonic() - t0 > self.startup_timeout:
                self.stop()
                raise ServiceError(f"mlflow server not healthy after {self.startup_timeout:.0f} s; see {log}")
            time.sleep(1.0)
        return self

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None
