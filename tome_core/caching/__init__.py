"""The step cache, one of the session's two capabilities: :class:`StepCache` (DeepCache over a family's blocks), its
schedule (``cache_schedule``: :mod:`.schedule`) and forecast (``cache_forecast``: :mod:`.forecast`), and the
ControlNet model that follows it (:mod:`.follower`)."""

from .cache import StepCache
from .follower import ControlFollower
from .forecast import Forecast
from .schedule import Schedule

__all__ = ["ControlFollower", "Forecast", "Schedule", "StepCache"]
