"""The cores a worker process can use, read from files laid out as cgroup v1 and v2 lay them out.

Given a folder standing for `/` (its `proc/self/cgroup` and `sys/fs/cgroup`), the
tightest of one core (the GIL) and every CPU quota on the process's cgroup path is
what it can use, and the quota's file is named where it binds.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from workers.servers.cpu_limits import GIL, CoreLimit, core_limit

ONE = CoreLimit(1.0, GIL)  # without a quota below one core, the GIL is the limit


def lay_out(root: Path, proc_cgroup: str, files: dict[str, str]) -> Path:
    """`root/proc/self/cgroup` and each `sys/fs/cgroup/...` file, as the kernel shows them."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(proc_cgroup)
    for name, text in files.items():
        path = root / "sys/fs/cgroup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return root


def v1_group(path: str, quota: int, period: int = 100_000) -> dict[str, str]:
    return {f"{path}/cpu.cfs_quota_us": str(quota), f"{path}/cpu.cfs_period_us": str(period)}


V1_HOST = "9:name=systemd:/\n4:memory:/process_api/abc\n1:cpu:/\n0::/\n"  # this machine's own layout


def test_a_v1_host_without_a_quota_leaves_the_gil(tmp_path):
    root = lay_out(tmp_path, V1_HOST, v1_group("cpu", -1))
    assert core_limit(root) == ONE


def test_a_v1_quota_of_a_quarter_core_on_the_processs_own_group_is_what_it_can_use(tmp_path):
    # Given the process in cpu,cpuacct:/fleet/w1 with a quarter core, its parent unlimited
    root = lay_out(tmp_path, "3:cpu,cpuacct:/fleet/w1\n0::/\n",
                   {**v1_group("cpu,cpuacct", -1), **v1_group("cpu,cpuacct/fleet", -1),
                    **v1_group("cpu,cpuacct/fleet/w1", 25_000)})
    # Then a quarter core, set by that group's file
    assert core_limit(root) == CoreLimit(0.25, "/sys/fs/cgroup/cpu,cpuacct/fleet/w1/cpu.cfs_quota_us")


def test_a_parents_tighter_v1_quota_binds_its_children(tmp_path):
    root = lay_out(tmp_path, "1:cpu:/fleet/w1\n",
                   {**v1_group("cpu", -1), **v1_group("cpu/fleet", 20_000, 50_000), **v1_group("cpu/fleet/w1", 50_000)})
    assert core_limit(root) == CoreLimit(0.4, "/sys/fs/cgroup/cpu/fleet/cpu.cfs_quota_us")


def test_a_v1_container_that_sees_its_hosts_path_reads_its_own_group_at_the_mount(tmp_path):
    # Given a container without a cgroup namespace: its line names the host's path, its own group is the mount
    root = lay_out(tmp_path, "5:cpu,cpuacct:/docker/0123abcd\n", v1_group("cpu,cpuacct", 50_000))
    assert core_limit(root) == CoreLimit(0.5, "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us")


def test_a_systemd_v1_host_names_the_quota_file_under_cpu_whichever_folder_it_reads(tmp_path):
    # Given the v1 layout of systemd hosts: `cpu,cpuacct` mounted, `cpu` a link to it
    root = lay_out(tmp_path, "4:cpu,cpuacct:/kubepods/pod1\n0::/\n", v1_group("cpu,cpuacct/kubepods/pod1", 50_000))
    (root / "sys/fs/cgroup/cpu").symlink_to(root / "sys/fs/cgroup/cpu,cpuacct")
    # Then the quota binds, and its file is named under `cpu`, every time
    assert core_limit(root) == CoreLimit(0.5, "/sys/fs/cgroup/cpu/kubepods/pod1/cpu.cfs_quota_us")


def test_a_v2_period_of_zero_is_no_limit(tmp_path):
    root = lay_out(tmp_path, "0::/pod\n", {"pod/cpu.max": "25000 0"})
    assert core_limit(root) == ONE


def test_a_quota_above_one_core_leaves_the_gil(tmp_path):
    root = lay_out(tmp_path, "1:cpu:/\n", v1_group("cpu", 150_000))
    assert core_limit(root) == ONE


def test_a_v2_quota_on_the_processs_group_or_above_binds(tmp_path):
    # Given a v2 service group with a quarter core under an unlimited slice
    root = lay_out(tmp_path, "0::/system.slice/fleet.service\n",
                   {"cgroup.controllers": "cpu memory", "system.slice/cpu.max": "max 100000",
                    "system.slice/fleet.service/cpu.max": "25000 100000"})
    assert core_limit(root) == CoreLimit(0.25, "/sys/fs/cgroup/system.slice/fleet.service/cpu.max")


def test_a_v2_container_with_its_own_namespace_reads_the_root_cpu_max(tmp_path):
    root = lay_out(tmp_path, "0::/\n", {"cpu.max": "50000 100000"})
    assert core_limit(root) == CoreLimit(0.5, "/sys/fs/cgroup/cpu.max")


def test_v2_max_is_no_limit(tmp_path):
    root = lay_out(tmp_path, "0::/\n", {"cpu.max": "max 100000"})
    assert core_limit(root) == ONE


@pytest.mark.parametrize("files", [{}, {"cpu/cpu.cfs_quota_us": "garbage"}, {"cpu.max": ""}],
                         ids=["no files", "unreadable v1 quota", "empty cpu.max"])
def test_what_cannot_be_read_is_no_limit(tmp_path, files):
    root = lay_out(tmp_path, "1:cpu:/\n0::/\n", files)
    assert core_limit(root) == ONE
    assert core_limit(tmp_path / "nowhere") == ONE


def test_this_machines_own_limit_is_at_most_one_core():
    limit = core_limit()
    assert 0 < limit.cores <= 1.0 and limit.source
