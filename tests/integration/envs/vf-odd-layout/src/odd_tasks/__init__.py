"""Word tasks (a package named unlike its distribution, vf-odd-layout)."""
