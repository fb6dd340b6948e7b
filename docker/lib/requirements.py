"""Image build helper: print the requirements of tritonbundle (and the given extras) from pyproject.toml.

    python3 requirements.py pyproject.toml [EXTRA[,EXTRA...]] > requirements.txt

Installing these with ``-c requirements/constraints.txt`` before the project itself keeps the
dependency layer cached until pyproject.toml or the constraints change (not on every source edit).
"""

import sys

import tomllib

project = tomllib.load(open(sys.argv[1], "rb"))["project"]
lines = list(project["dependencies"])
extras = [e for e in (sys.argv[2] if len(sys.argv) > 2 else "").split(",") if e]
for extra in extras:
    lines += project["optional-dependencies"][extra]
print("\n".join(dict.fromkeys(lines)))
