"""Where model files saved before the update code became :mod:`sb3_ippo.update` find ``UpdateStats`` (a zip names
the class path of what it pickled). New code imports from :mod:`sb3_ippo.update`."""

from sb3_ippo.update.ppo import UpdateStats

__all__ = ["UpdateStats"]
