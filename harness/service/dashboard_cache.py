"""A bounded, thread-safe memory cache that makes each value once (the dashboard's).

The service answers from a thread pool, and a page's plots are asked for together: on
a cold cache, fifty requests for the plots of one page would each build the same page
model (a second of loading runs) at once. ``get_or_make`` lets the first build it while
the others wait for it, then all read the one copy.

Values are weighed (bytes of an SVG, points of a model) and the least recently used are
dropped past ``max_weight``; one heavier than that is made and returned but not kept.
Keys name their content — the runs a model holds, the hash of what a plot draws — so a
value never goes stale and nothing needs invalidating: a new run makes new keys.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class MadeOnce(Generic[K, V]):
    def __init__(self, max_weight: int, weigh: Callable[[V], int]) -> None:
        self.max_weight = max_weight
        self._weigh = weigh
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._weight = 0
        self._lock = threading.Lock()
        self._making: dict[K, threading.Lock] = {}
        #: How many values were made (a test's and a benchmark's view of the misses).
        self.made = 0

    def get(self, key: K) -> V | None:
        with self._lock:
            found = self._items.get(key)
            if found is None:
                return None
            self._items.move_to_end(key)
            return found[0]

    def get_or_make(self, key: K, make: Callable[[], V]) -> V:
        found = self.get(key)
        if found is not None:
            return found
        with self._lock:
            making = self._making.setdefault(key, threading.Lock())
        with making:
            found = self.get(key)
            if found is None:
                found = make()
                self._put(key, found)
        with self._lock:
            self._making.pop(key, None)
        return found

    def _put(self, key: K, value: V) -> None:
        weight = self._weigh(value)
        with self._lock:
            self.made += 1
            if weight > self.max_weight:
                return
            old = self._items.pop(key, None)
            if old is not None:
                self._weight -= old[1]
            self._items[key] = (value, weight)
            self._weight += weight
            while self._weight > self.max_weight:
                _, (_, dropped) = self._items.popitem(last=False)
                self._weight -= dropped
