"""The guard that keeps a test run from passing on an earlier run's daemons reads `ss`."""

from gpuserve_sandbox.isolation import parse_ss

SS = """\
LISTEN 0      5      10.231.99.1:8900       0.0.0.0:*    users:(("python",pid=4242,fd=3))
LISTEN 0      100    10.231.99.1:3142       0.0.0.0:*    users:(("apt-cacher-ng",pid=77,fd=9))
LISTEN 0      128    10.231.9.1:8900        0.0.0.0:*    users:(("python",pid=5,fd=3))
LISTEN 0      128    0.0.0.0:22             0.0.0.0:*    users:(("sshd",pid=1,fd=3))
LISTEN 0      128    10.231.99.7:8000       0.0.0.0:*
"""


def test_only_the_instance_subnet_is_reported_with_its_process():
    assert parse_ss(SS, "10.231.99.") == [
        ("10.231.99.1:8900", 8900, "python pid 4242"),
        ("10.231.99.1:3142", 3142, "apt-cacher-ng pid 77"),
        ("10.231.99.7:8000", 8000, "unknown process"),
    ]


def test_a_prefix_is_not_matched_inside_another_subnet():
    # 10.231.9. must not match 10.231.99.x (and the other way round)
    assert [p for _, p, _ in parse_ss(SS, "10.231.9.")] == [8900]
