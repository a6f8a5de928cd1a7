"""The Jinja2 templates of every systemd unit, drop-in and nginx file gpuserve writes (issue 28),
rendered by one pure function:

    render("gpuserve.service.j2", deployment="minimax", ...)  -> the file's text

They live in the top-level ``templates/`` of a checkout (where a pyinfra reader looks for them).
The wheel ships them
as ``gpuserve/templates/`` (pyproject.toml maps the folder into the package at build time), and
this module finds them either way. The environment is pyinfra's ``files.template``'s: a missing
variable fails (StrictUndefined) and the text keeps its last newline, so a unit renders to the
same bytes as it did through ``files.template`` (tests/unit/layers/test_rendered_files.py).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import jinja2

_PACKAGE = Path(__file__).resolve().parent


def templates_dir() -> Path:
    """``gpuserve/templates/`` in an installed wheel, else the checkout's top-level ``templates/``
    (a folder left empty in a checkout, by an older layout, does not count)."""
    installed = _PACKAGE / "templates"
    return installed if (installed / "gpuserve.service.j2").is_file() else _PACKAGE.parent / "templates"


TEMPLATES = templates_dir()


@cache
def _environment(directory: Path) -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(directory)), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, autoescape=False)


def render(name: str, **variables: object) -> str:
    """The text of template ``name`` (a file of templates/) with ``variables``."""
    return _environment(TEMPLATES).get_template(name).render(variables)
