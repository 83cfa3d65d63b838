"""Tools over training run directories, finished or crashed (`rlkit runs show|audit`)."""
