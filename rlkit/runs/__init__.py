"""Browsing finished and running training runs (`rlkit runs ...`)."""
