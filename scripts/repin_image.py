"""Developer task: re-resolve images/requirements.in into images/requirements.txt, keeping
today's pins (delete a line from requirements.txt to upgrade it).

    .venv/bin/python scripts/repin_image.py [PYTHON_VERSION]   # 3.11: the debootstrap base's
"""

import sys

from sandcell.sandbox.image_build import repin

if __name__ == "__main__":
    repin(*sys.argv[1:2])
