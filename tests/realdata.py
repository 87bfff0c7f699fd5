"""Real CSV files shipped by dataset packages on PyPI (palmerpenguins, vega_datasets)."""

from pathlib import Path

import palmerpenguins
import vega_datasets

PENGUINS = Path(palmerpenguins.__file__).parent / "data" / "penguins.csv"
VEGA = Path(vega_datasets.__file__).parent / "_data"
CSVS = [PENGUINS] + sorted(VEGA.glob("*.csv"))
