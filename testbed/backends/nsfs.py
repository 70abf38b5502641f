"""Named network namespaces, made the way `ip netns add` makes them, but in-process and fast.

`create` unshares the calling thread's network namespace, bind-mounts it at /run/netns/NAME (iproute2's
convention, so `ip netns exec` works on ours) and returns the thread to where it was. `entered` runs a
block inside a namespace: netlink sockets and /proc/sys files opened there stay bound to it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager

from testbed.errors import TestbedError

NETNS_RUN_DIR = "/run/netns"
CLONE_NEWNET = 0x40000000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_SHARED = 1 << 20
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def path_of(name: str) -> str:
    """/run/netns/NAME for a name; an absolute path (e.g. /proc/PID/ns/net) is returned as it is."""
    return name if name.startswith("/") else os.path.join(NETNS_RUN_DIR, name)


def exists(name: str) -> bool:
    return os.path.exists(path_of(name))


def _ensure_run_dir() -> None:
    """Make /run/netns a shared mount point, as iproute2 does, so mounts propagate to other mount namespaces."""
    os.makedirs(NETNS_RUN_DIR, mode=0o755, exist_ok=True)
    if _libc.mount(b"", NETNS_RUN_DIR.encode(), b"none", MS_SHARED | MS_REC, None) == 0:
        return
    if ctypes.get_errno() != errno.EINVAL:
        _check(-1, f"mount --make-rshared {NETNS_RUN_DIR}")
    _check(_libc.mount(NETNS_RUN_DIR.encode(), NETNS_RUN_DIR.encode(), b"none", MS_BIND | MS_REC, None),
           f"mount --bind {NETNS_RUN_DIR}")
    _check(_libc.mount(b"", NETNS_RUN_DIR.encode(), b"none", MS_SHARED | MS_REC, None),
           f"mount --make-rshared {NETNS_RUN_DIR}")


def create(name: str) -> None:
    """Create the named namespace. Raises FileExistsError if it exists."""
    _ensure_run_dir()
    target = path_of(name)
    fd = os.open(target, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o444)
    os.close(fd)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        try:
            _check(_libc.mount(b"/proc/thread-self/ns/net", target.encode(), b"none", MS_BIND, None),
                   f"bind-mount namespace at {target}")
        finally:
            _check(_libc.setns(home, CLONE_NEWNET), "setns back to the original namespace")
    except BaseException:
        os.unlink(target)
        raise
    finally:
        os.close(home)


def attach(name: str, pid: int) -> None:
    """Pin the network namespace of a running process at /run/netns/NAME, as `ip netns attach NAME PID` does."""
    _ensure_run_dir()
    target = path_of(name)
    fd = os.open(target, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o444)
    os.close(fd)
    try:
        _check(_libc.mount(f"/proc/{pid}/ns/net".encode(), target.encode(), b"none", MS_BIND, None),
               f"bind-mount the namespace of PID {pid} at {target}")
    except BaseException:
        os.unlink(target)
        raise


def remove(name: str) -> bool:
    """Unmount and delete the named namespace. Returns False if it did not exist."""
    target = path_of(name)
    if not os.path.exists(target):
        return False
    if _libc.umount2(target.encode(), MNT_DETACH) != 0 and ctypes.get_errno() not in (errno.EINVAL, errno.ENOENT):
        _check(-1, f"umount {target}")
    try:
        os.unlink(target)
    except FileNotFoundError:
        return False
    return True


def inode(name: str) -> int | None:
    """Inode number of the namespace (what /proc/PID/ns/net links to), or None if it is gone."""
    try:
        return os.stat(path_of(name)).st_ino
    except FileNotFoundError:
        return None


@contextmanager
def entered(name: str) -> Iterator[None]:
    """Run the block with this thread inside the namespace; always return to the original one."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(path_of(name), os.O_RDONLY)
    try:
        _check(_libc.setns(target, CLONE_NEWNET), f"setns into {name}")
        try:
            yield
        finally:
            _check(_libc.setns(home, CLONE_NEWNET), "setns back to the original namespace")
    finally:
        os.close(target)
        os.close(home)


def enter_in_child(name: str) -> None:
    """For `preexec_fn`: move the (forked) child into the namespace before it execs."""
    fd = os.open(path_of(name), os.O_RDONLY)
    _check(_libc.setns(fd, CLONE_NEWNET), f"setns into {name}")
    os.close(fd)


class SysctlRefused(TestbedError, OSError):
    """The kernel refused a sysctl value; the message says which and, where known, what it allows."""

    def __init__(self, errno: int, message: str) -> None:
        super().__init__(message)
        self.errno, self.strerror = errno, message


def write_sysctl(key: str, value: str) -> None:
    """Write a sysctl in the current thread's namespace (call inside `entered`)."""
    try:
        with open("/proc/sys/" + key.replace(".", "/"), "w") as f:
            f.write(value)
    except OSError as exc:
        hint = ""
        if key == "net.ipv4.tcp_congestion_control":
            with contextlib.suppress(OSError):
                allowed = read_sysctl("net.ipv4.tcp_allowed_congestion_control")
                hint = (f": the kernel allows {allowed!r} in namespaces (net.ipv4.tcp_allowed_congestion_control); "
                        "set the topology's tcp.congestion_control to one of them")
        raise SysctlRefused(exc.errno, f"{key}={value} refused ({exc.strerror}){hint}") from None


def read_sysctl(key: str) -> str:
    with open("/proc/sys/" + key.replace(".", "/")) as f:
        return f.read().strip()
