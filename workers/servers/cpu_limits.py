"""How many cores this process can use: one (the GIL), fewer where its cgroup's CPU quota allows less.

The invariant: `core_limit()` is never more than one core nor the quota of
the process's own cgroup or any group above it (an affinity is at least one
whole core, so it never binds below the GIL). It holds
because a group's quota caps every group below it, so the tightest quota on
the path from the process's group up to the hierarchy's root is the one that
binds, and each is read:

- cgroup v2: `cpu.max` ("max 100000" unlimited, "25000 100000" a quarter of a
  core) in each directory from `/sys/fs/cgroup/<path of "0::">` up.
- cgroup v1: `cpu.cfs_quota_us` over `cpu.cfs_period_us` (a quota of -1 is
  unlimited) in each directory from `<the cpu controller's mount>/<path of its
  line>` up; the mount is `/sys/fs/cgroup/cpu` or named by its controllers
  (`cpu,cpuacct`).

Where the process's own path is not under the mount (a container that sees
its host's path but has its own group mounted at the root), the mount's root
is the process's group. A file that cannot be read is no limit: the signal
then judges against one core, as before. Every path is under `root`, so a
spec can lay out either version in a folder.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

GIL = "the GIL"


@dataclass(frozen=True)
class CoreLimit:
    """The cores the process can use and what sets them: the GIL, or a quota file."""
    cores: float
    source: str

    @property
    def quota_file(self) -> str | None:
        """The quota file that sets the limit, where a cgroup quota is what binds."""
        return None if self.source == GIL else self.source


def core_limit(root: Path = Path("/")) -> CoreLimit:
    """The tightest of one core and every quota on the process's cgroup path."""
    limit = CoreLimit(1.0, GIL)
    for quota, where in cgroup_quotas(root):
        if quota < limit.cores:
            limit = CoreLimit(quota, str(Path("/") / where.relative_to(root)))
    return limit


def cgroup_quotas(root: Path) -> list[tuple[float, Path]]:
    """Each CPU quota (in cores) on the process's cgroup paths, v1 and v2, with the file that sets it."""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    base, found = root / "sys/fs/cgroup", []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "" and path:  # v2's unified line "0::/path"
            found += [q for d in _upward(base, path) if (q := _v2_quota(d))]
        elif "cpu" in controllers.split(","):
            for mount in _v1_mounts(base, controllers):
                found += [q for d in _upward(mount, path) if (q := _v1_quota(d))]
    return found


def _v1_mounts(base: Path, controllers: str) -> list[Path]:
    """Where the v1 hierarchy with the `cpu` controller is mounted: `cpu` first (a file named under
    it is the one operators know), then its controllers' own name (`cpu,cpuacct`), the same
    folder once where one is a link to the other."""
    mounts: dict[Path, Path] = {}
    for mount in (base / "cpu", base / controllers):
        if mount.is_dir():
            mounts.setdefault(mount.resolve(), mount)
    return list(mounts.values())


def _upward(mount: Path, path: str) -> list[Path]:
    """The group's directory under `mount` and each above it, to the mount; the mount alone where
    the path is not under it (a container's own group mounted at the root)."""
    if not mount.is_dir():
        return []
    group = mount / path.lstrip("/")
    if not group.is_dir():
        return [mount]
    return [group, *[p for p in group.parents if p.is_relative_to(mount)]]


def _v2_quota(folder: Path) -> tuple[float, Path] | None:
    where = folder / "cpu.max"
    try:
        limit, period = where.read_text().split()[:2]
        return None if limit == "max" else (int(limit) / int(period), where)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _v1_quota(folder: Path) -> tuple[float, Path] | None:
    where = folder / "cpu.cfs_quota_us"
    try:
        quota, period = int(where.read_text()), int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota < 0 or period <= 0 else (quota / period, where)
