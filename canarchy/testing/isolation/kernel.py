"""The Linux kernel interface the containment uses: system calls through ctypes, their constants,
a user namespace's id maps and the loopback's flags. Each call raises OSError with the errno.

Constants: ``<linux/sched.h>``, ``<linux/mount.h>``, ``<linux/fcntl.h>``, ``<linux/sockios.h>``; system call
numbers: ``asm-generic/unistd.h``. Standard library only: :mod:`.containment`, loaded by path in a fresh child
Python, loads this file beside it the same way.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct

# <linux/sched.h>
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
# <linux/mount.h>, <sys/mount.h>
MS_REC = 0x4000
MS_BIND = 0x1000
MS_PRIVATE = 1 << 18
MNT_DETACH = 0x2
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8
OPEN_TREE_CLONE = 0x1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH = 0x4
FSOPEN_CLOEXEC = 0x1
FSMOUNT_CLOEXEC = 0x1
FSCONFIG_CMD_CREATE = 6
# <linux/fcntl.h>
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
# <linux/sockios.h>, <net/if.h>
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
_IFREQ = "16sH22x"  # struct ifreq: the name, then ifr_flags in the 24-byte union
# The generic syscall table (asm-generic/unistd.h); every architecture below
# numbers these (Linux 5.2 to 5.12) alike.
_SYSCALLS = {"open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
             "mount_setattr": 442}
_GENERIC_TABLE = ("x86_64", "i386", "i486", "i586", "i686", "aarch64", "arm64", "armv6l", "armv7l", "armv8l",
                  "riscv64", "ppc64le", "ppc64", "s390x", "loongarch64")


# -- system calls --------------------------------------------------------------------

_LIBC = None


def _libc() -> ctypes.CDLL:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _checked(result: int, what: str) -> int:
    if result == -1:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


def _syscall(name: str, *args) -> int:
    return _checked(_libc().syscall(ctypes.c_long(_SYSCALLS[name]), *args), name)


def _path(path: str | os.PathLike | None) -> ctypes.c_char_p:
    return ctypes.c_char_p(None if path is None else os.fsencode(path))


#: keyctl(2) by architecture (its number is not in the generic table for every one: x86's are their own).
KEYCTL = {"x86_64": 250, "i386": 288, "i486": 288, "i586": 288, "i686": 288, "aarch64": 219, "arm64": 219,
          "riscv64": 219, "loongarch64": 219}
KEYCTL_JOIN_SESSION_KEYRING = 1


def join_new_session_keyring() -> None:
    """Make this process, and what it starts from now on, use a new anonymous session keyring
    (``keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL)``, keyrings(7)). Raises ``OSError`` (``ENOSYS`` on an
    architecture not in :data:`KEYCTL`)."""
    import platform

    number = KEYCTL.get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, f"keyctl: no system call number known for {platform.machine()}")
    _checked(_libc().syscall(ctypes.c_long(number), ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING), None),
             "keyctl(KEYCTL_JOIN_SESSION_KEYRING)")


def unshare(flags: int) -> None:
    """``unshare(2)``: ``os.unshare`` (3.12+) or libc's; OSError with the errno."""
    if hasattr(os, "unshare"):
        os.unshare(flags)
    else:
        _checked(_libc().unshare(ctypes.c_int(flags)), "unshare")


def mount(source, target, fstype, flags: int, data: str | None = None) -> None:
    """``mount(2)``; OSError with the errno."""
    _checked(_libc().mount(_path(source), _path(target), _path(fstype), ctypes.c_ulong(flags),
                           _path(data)), f"mount {target}")


def umount2(target, flags: int = 0) -> None:
    """``umount2(2)``; OSError with the errno."""
    _checked(_libc().umount2(_path(target), ctypes.c_int(flags)), f"umount {target}")


def mount_setattr(target, attr_set: int = 0, attr_clr: int = 0, *, recursive: bool = False,
                  dirfd: int = AT_FDCWD) -> None:
    """``mount_setattr(2)`` (Linux 5.12): set/clear ``MOUNT_ATTR_*`` on the
    mount at ``target`` (or on ``dirfd`` itself when ``target`` is "")."""
    attr = struct.pack("QQQQ", attr_set, attr_clr, 0, 0)  # struct mount_attr
    flags = (AT_RECURSIVE if recursive else 0) | (AT_EMPTY_PATH if target == "" else 0)
    _syscall("mount_setattr", ctypes.c_int(dirfd), _path(target), ctypes.c_uint(flags), attr,
             ctypes.c_size_t(len(attr)))


def _open_tree(target, *, dirfd: int = AT_FDCWD, recursive: bool = True) -> int:
    """A detached copy of the mount tree at ``target`` (``open_tree(2)``, Linux 5.2)."""
    flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | (AT_RECURSIVE if recursive else 0)
    return _syscall("open_tree", ctypes.c_int(dirfd), _path(target), ctypes.c_uint(flags))


def _move_mount(tree: int, target) -> None:
    """Attach the detached tree ``tree`` at ``target`` (``move_mount(2)``)."""
    _syscall("move_mount", ctypes.c_int(tree), _path(""), ctypes.c_int(AT_FDCWD), _path(target),
             ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH))


def _new_fs(fstype: str, attributes: int = 0) -> int:
    """A detached, new instance of ``fstype`` (``fsopen``/``fsconfig``/``fsmount``),
    nosuid, nodev, noexec and ``attributes`` (``MOUNT_ATTR_*``)."""
    context = _syscall("fsopen", _path(fstype), ctypes.c_uint(FSOPEN_CLOEXEC))
    try:
        _syscall("fsconfig", ctypes.c_int(context), ctypes.c_uint(FSCONFIG_CMD_CREATE), None, None, ctypes.c_int(0))
        return _syscall("fsmount", ctypes.c_int(context), ctypes.c_uint(FSMOUNT_CLOEXEC),
                        ctypes.c_uint(MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC | attributes))
    finally:
        os.close(context)


# -- a user namespace's id maps, the loopback ------------------------------------------

def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _map_ids(uid: int, gid: int) -> None:
    """Map ``uid``/``gid`` to themselves in the user namespace just entered."""
    try:
        _write("/proc/self/setgroups", "deny")  # required before gid_map without CAP_SETGID outside
    except FileNotFoundError:  # pragma: no cover - kernels before 3.19
        pass
    _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
    _write("/proc/self/gid_map", f"{gid} {gid} 1\n")


def _bring_loopback_up() -> None:
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack(_IFREQ, b"lo", 0)
        _, flags = struct.unpack(_IFREQ, fcntl.ioctl(sock, SIOCGIFFLAGS, request))
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | IFF_UP))
