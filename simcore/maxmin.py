"""Max-min fair rates by progressive filling (water-filling), vectorized over (flow, link) entries.

A flow crossing links ``L_f`` with its own rate cap gets the max-min fair rate: raise every
unfrozen flow's rate together; when a link fills, the flows crossing it freeze at that
level; a flow reaching its cap freezes there. Each round freezes every flow of every link
whose fair share is within ``rtol`` of the lowest one, so a symmetric pattern (a ring step,
an all-to-all on a uniform fabric) finishes in one or a few rounds whatever its flow count.

Performance note: one round is a handful of numpy passes over the still-unfrozen entries,
so a recomputation costs O(rounds x entries); rounds = distinct bottleneck levels.
"""

from __future__ import annotations

import numpy as np

__all__ = ["max_min_rates"]


def max_min_rates(flow_of_entry: np.ndarray, link_of_entry: np.ndarray, capacity: np.ndarray,
                  rate_cap: np.ndarray, rtol: float = 1e-9) -> np.ndarray:
    """Max-min fair rate of every flow, bytes/s.

    Parameters
    ----------
    flow_of_entry, link_of_entry : numpy.ndarray of int
        Entry ``e`` says flow ``flow_of_entry[e]`` crosses link ``link_of_entry[e]``; a link
        appearing twice for one flow counts twice.
    capacity : numpy.ndarray of float
        Capacity of each link, bytes/s (positive).
    rate_cap : numpy.ndarray of float
        Per-flow rate cap, bytes/s (``inf`` for none); its length is the number of flows.
    rtol : float
        Links whose fair share is within this relative distance of the lowest one fill in
        the same round (their flows get the lowest level: never above capacity).

    Returns
    -------
    numpy.ndarray
        Rate per flow. A flow crossing no link gets its cap.

    Examples
    --------
    Two flows share link 0 (capacity 10); flow 1 also crosses link 1 (capacity 2):

    >>> max_min_rates(np.array([0, 1, 1]), np.array([0, 0, 1]), np.array([10.0, 2.0]),
    ...               np.array([np.inf, np.inf])).tolist()
    [8.0, 2.0]
    """
    num_flows = len(rate_cap)
    rate = np.asarray(rate_cap, dtype=float).copy()
    remaining = np.asarray(capacity, dtype=float).copy()
    count = np.bincount(link_of_entry, minlength=len(remaining)).astype(float)
    flows, links = np.asarray(flow_of_entry), np.asarray(link_of_entry)
    caps = rate[flows]
    while flows.size:
        share = remaining[links] / count[links]
        level = min(share.min(), caps.min())
        level = max(level, 0.0)  # guards against -0.0 from rounding on a just-filled link
        limit = level * (1.0 + rtol)
        hit = (share <= limit) | (caps <= limit)
        frozen = np.zeros(num_flows, dtype=bool)
        frozen[flows[hit]] = True
        rate[frozen] = np.minimum(rate[frozen], level)
        gone = frozen[flows]
        dec = np.bincount(links[gone], minlength=len(remaining))
        remaining -= dec * level
        count -= dec
        keep = ~gone
        flows, links, caps = flows[keep], links[keep], caps[keep]
    return rate
