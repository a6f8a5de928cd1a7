import pytest

from gpuserve.layers.proxy import keys_map
from gpuserve.status import Row, render_table


def test_keys_map_lists_each_accepted_header():
    assert keys_map(["k1", "abc.DEF-123"]) == '"Bearer k1" 1;\n"Bearer abc.DEF-123" 1;\n'
    with pytest.raises(ValueError):
        keys_map(['bad"key'])          # would break out of the nginx string


def test_status_table_aligns_columns():
    text = render_table([Row("sandbox-1", "minimax", "r-1", "-", "active, /health 200", "tiny", "none")])
    header, row = text.splitlines()
    assert header.split() == ["HOST", "DEPLOYMENT", "RELEASE", "PREVIOUS", "HEALTH", "SERVED", "MODEL", "GPUS"]
    assert row.index("minimax") == header.index("DEPLOYMENT")
    assert row.index("tiny") == header.index("SERVED MODEL")
