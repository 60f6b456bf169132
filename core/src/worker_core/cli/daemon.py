"""Running as a daemon, as ``celery worker --detach`` does: the pid file, dropping privileges,
and detaching (fork, new session, fork, ``--workdir``, ``--umask``, standard streams to
/dev/null, then the same command again without ``-D``).
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from ..exceptions import ConfigurationError

__all__ = ["Pidfile", "alive", "detach", "drop_privileges", "parse_umask", "without_detach"]

#: the exit status of a worker whose pid file a running process holds (Celery's EX_CANTCREAT)
EX_CANTCREAT = 73


class Pidfile:
    """A pid file: the pid and a newline, created only when no running process holds it (a file
    whose process is gone is stale and replaced), removed when the worker exits."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self._owned = False

    def read_pid(self) -> int | None:
        """The pid in the file; None when there is no file. ``ValueError`` when it holds no pid."""
        try:
            with open(self.path, encoding="ascii", errors="replace") as file:
                line = file.readline()
        except FileNotFoundError:
            return None
        if not line.endswith("\n"):
            raise ValueError(f"partial pid file {self.path}")
        try:
            return int(line)
        except ValueError:
            raise ValueError(f"pid file {self.path} holds no pid ({line.strip()!r})") from None

    def holder(self) -> int | None:
        """The running process that holds the file, if any; a stale or broken file is removed."""
        try:
            pid = self.read_pid()
        except ValueError:
            self.remove()
            return None
        if pid is None:
            return None
        if pid != os.getpid() and alive(pid):
            return pid
        self.remove()
        return None

    def check(self) -> None:
        """Refuse a file a running process holds (one line naming it and the fix)."""
        pid = self.holder()
        if pid is not None:
            raise PidfileHeld(
                f"--pidfile {self.path}: process {pid} holds it (is this worker running already?); "
                f"stop it first, or give another --pidfile"
            )

    def acquire(self) -> None:
        """Create the file holding this process's pid, whole at once: written beside it, then
        linked to its name, which fails if another process created it meanwhile (no reader ever
        sees it empty)."""
        self.check()
        folder = os.path.dirname(self.path)
        temporary = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(temporary, "w", encoding="ascii") as file:
                file.write(f"{os.getpid()}\n")
            os.chmod(temporary, 0o644)
            os.link(temporary, self.path)
        except FileExistsError:
            raise PidfileHeld(f"--pidfile {self.path}: another process created it just now; is this worker "
                              "starting twice?") from None
        except OSError as exc:
            raise ConfigurationError(
                f"--pidfile {self.path}: cannot create it ({exc.strerror}); create {folder} or give a "
                "path this user may write"
            ) from None
        finally:
            try:
                os.unlink(temporary)
            except OSError:
                pass
        self._owned = True

    def release(self) -> None:
        """Remove the file if this process wrote it and it still names this process."""
        if not self._owned:
            return
        self._owned = False
        try:
            if self.read_pid() == os.getpid():
                self.remove()
        except ValueError:
            pass

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.EACCES):
                raise


class PidfileHeld(ConfigurationError):
    """A running process holds the pid file."""


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (someone else's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    return True


def parse_umask(text: str | None) -> int | None:
    """``--umask``: octal with a leading 0 (``0o22`` too), decimal otherwise, as Celery reads it."""
    if text is None or text == "":
        return None
    value = text.strip()
    try:
        if value.lower().startswith("0o"):
            return int(value[2:], 8)
        return int(value, 8 if value.startswith("0") else 10)
    except ValueError:
        raise ConfigurationError(f"--umask must be a number, octal with a leading 0, for example 0022 "
                                 f"(got {text!r})") from None


def drop_privileges(uid: str | None, gid: str | None) -> None:
    """Become ``uid``/``gid`` (names or numbers); the user's own group when only ``uid`` is
    given. Nothing to do when this process already runs as them."""
    if not uid and not gid:
        return
    import grp
    import pwd

    user = None
    if uid:
        try:
            user = pwd.getpwuid(int(uid)) if uid.isdigit() else pwd.getpwnam(uid)
        except (KeyError, OverflowError):
            raise ConfigurationError(f"--uid {uid}: no such user") from None
    group_id: int | None = None
    if gid:
        try:
            group_id = int(gid) if gid.isdigit() else grp.getgrnam(gid).gr_gid
        except KeyError:
            raise ConfigurationError(f"--gid {gid}: no such group") from None
    elif user is not None:
        group_id = user.pw_gid
    if (user is None or user.pw_uid == os.getuid()) and (group_id is None or group_id == os.getgid()):
        return
    try:
        if group_id is not None and group_id != os.getgid():
            os.setgid(group_id)
        if user is not None and user.pw_uid != os.getuid():
            os.initgroups(user.pw_name, group_id if group_id is not None else user.pw_gid)
            os.setuid(user.pw_uid)
    except PermissionError:
        raise ConfigurationError(
            f"cannot drop privileges to {'--uid ' + uid if uid else ''}{' --gid ' + gid if gid else ''}: "
            "only root may change its user or group; start the worker as root, or without --uid/--gid"
        ) from None
    if user is not None and user.pw_uid != 0:
        try:
            os.setuid(0)
        except PermissionError:
            return
        raise ConfigurationError(f"--uid {uid}: the worker could become root again after dropping privileges")


def without_detach(argv: Sequence[str]) -> list[str]:
    """The command line again without ``-D``/``--detach``, with ``--workdir`` made absolute
    (the detached worker starts in it already)."""
    out: list[str] = []
    position = 0
    while position < len(argv):
        arg = argv[position]
        position += 1
        if arg == "--":
            out.extend(argv[position - 1:])
            break
        if arg in ("-D", "--detach"):
            continue
        if arg == "--workdir" and position < len(argv):
            out += [arg, os.getcwd()]
            position += 1
            continue
        if arg.startswith("--workdir="):
            out.append(f"--workdir={os.getcwd()}")
            continue
        out.append(arg)
    return out


def detach(argv: Sequence[str], *, executable: str | None, logfile: str | None,
           umask: int | None) -> NoReturn:
    """Start ``executable -m worker_core *argv`` as a daemon and exit: fork (the caller exits
    0), new session, fork again, ``umask``, standard streams to /dev/null, exec. ``logfile``
    (already expanded) is created first, so that a path the daemon could not write is an error
    here rather than a silent daemon."""
    if logfile:
        try:
            open(logfile, "a").close()  # only checks that the daemon can write it
        except OSError as exc:
            raise ConfigurationError(f"--logfile {logfile}: cannot write it ({exc.strerror}); create its "
                                     "directory or give a path this user may write") from None
    program = executable or sys.executable
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    if umask is not None:
        os.umask(umask)
    null = os.open(os.devnull, os.O_RDWR)
    for stream in (0, 1, 2):
        os.dup2(null, stream)
    if null > 2:
        os.close(null)
    try:
        os.execv(program, [program, "-m", "worker_core", *argv])
    except OSError as exc:
        if logfile:
            with open(logfile, "a", encoding="utf-8") as file:
                file.write(f"[detach] cannot run {program}: {exc.strerror}; check --executable\n")
        os._exit(1)
