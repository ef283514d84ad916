"""Max-min fair rates by progressive filling (water-filling), vectorized over (flow, link) entries.

Progressive filling raises every unfrozen flow's rate together; when a link fills, the flows
crossing it freeze at that level, and a flow reaching its own rate cap freezes there. The
textbook loop fills one link per round, so a pattern with many distinct bottleneck levels
(ECMP collisions in an all-to-all) needs as many rounds. Here every round freezes all links
that are *local* bottlenecks at once:

    share(l) = remaining(l) / unfrozen flows on l
    m(f)     = min(rate_cap(f), min over links l of f of share(l))
    l is ready when m(f) >= share(l) for every unfrozen flow f on l.

Shares only grow as flows freeze below them, so no flow of a ready link can freeze below
``share(l)``: the link fills at exactly that level, which is what progressive filling
would give. Likewise a flow whose cap is below every share of its links freezes at its cap.
The global minimum-share link is always ready (or one of its flows is capped), so every
round makes progress; rounds = depth of the bottleneck dependency chain.

Warm start (``guess``): a feasible allocation is max-min fair exactly when every flow is at
its cap or has a *bottleneck*, a saturated link on which no flow is faster (Bertsekas and
Gallager, Data Networks, 6.5.2). After a few flows leave or join, most flows keep their
bottleneck; only the unsettled ones are re-solved on the capacity the others leave, and
the check is repeated (adding newly unsettled flows) until it passes, falling back to a
full solve when more than half the flows are involved. The answer is the same allocation.

Weights: a flow of weight w stands for w identical flows (same links, same cap) and gets w times
the share of a flow of weight 1 on every link; rates are per unit. Progressive filling over the w
flows gives each of them the same rate, so the answer is exact; the network merges identical
pipelined channels this way (16 ring channels over one node's NVSwitch are one flow of weight 16).

Performance note: a round is ~20 numpy calls over the still-unfrozen entries, kept sorted
by flow so per-flow minima are one ``reduceat``; no Python loop runs over flows or links.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["max_min_rates", "unsettled_flows"]


def max_min_rates(flow_of_entry: np.ndarray, link_of_entry: np.ndarray, capacity: np.ndarray,
                  rate_cap: np.ndarray, rtol: float = 1e-9, guess: np.ndarray | None = None,
                  weight: np.ndarray | None = None) -> np.ndarray:
    """Max-min fair rate of every flow, bytes/s.

    Parameters
    ----------
    flow_of_entry, link_of_entry : numpy.ndarray of int
        Entry ``e`` says flow ``flow_of_entry[e]`` crosses link ``link_of_entry[e]``, in any
        order (entries already sorted by flow skip a sort). A link listed twice for one
        flow carries that flow's rate twice.
    capacity : numpy.ndarray of float
        Capacity of each link, bytes/s (positive).
    rate_cap : numpy.ndarray of float
        Per-flow rate cap, bytes/s (``inf`` for none); its length is the number of flows.
    rtol : float
        Relative tolerance of the readiness and bottleneck tests. A flow is never given more
        than the fair share of any of its links, so no link is ever above capacity.
    guess : numpy.ndarray of float, optional
        Previous rates (``nan`` for new flows) to warm-start from (module docstring).
    weight : numpy.ndarray of float, optional
        Identical flows each flow stands for (default 1); caps and returned rates are per unit.

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
    flows = np.asarray(flow_of_entry, dtype=np.intp)
    links = np.asarray(link_of_entry, dtype=np.intp)
    if flows.size > 1 and (flows[1:] < flows[:-1]).any():
        order = np.argsort(flows, kind="stable")
        flows, links = flows[order], links[order]
    capacity = np.asarray(capacity, dtype=float)
    rate_cap = np.asarray(rate_cap, dtype=float)
    guess = None if guess is None else np.asarray(guess, dtype=float)
    w = None if weight is None else np.asarray(weight, dtype=float)
    if guess is None or np.isnan(guess).sum() * 2 > len(guess):
        if len(rate_cap) == 1 and flows.size and (w is None or w[0] > 0):
            return _one_flow(links, capacity, rate_cap, w)
        return _fill(flows, links, capacity, rate_cap, rtol, w)
    rate = np.nan_to_num(guess, nan=0.0)
    linked = np.zeros(len(rate), dtype=bool)
    linked[flows] = True
    rate[~linked] = rate_cap[~linked]
    todo = np.isnan(guess) | unsettled_flows(flows, links, capacity, rate_cap, rate, rtol, w)
    while todo.any():
        if todo.sum() * 2 > len(rate):
            return _fill(flows, links, capacity, rate_cap, rtol, w)
        mine = todo[flows]
        total = rate if w is None else rate * w
        residual = capacity - np.bincount(links[~mine], weights=total[flows[~mine]], minlength=len(capacity))
        sub = _fill(flows[mine], links[mine], np.maximum(residual, 0.0), rate_cap, rtol, w)
        rate[todo] = sub[todo]
        unsettled = unsettled_flows(flows, links, capacity, rate_cap, rate, rtol, w)
        if not unsettled.any():
            break
        # Re-solve the unsettled flows with every flow sharing a link with them.
        touched = np.zeros(len(capacity), dtype=bool)
        touched[links[unsettled[flows]]] = True
        before = int(todo.sum())
        todo[flows[touched[links]]] = True
        if todo.sum() == before:  # cannot happen in exact arithmetic; rounding safety net
            return _fill(flows, links, capacity, rate_cap, rtol, w)
    return rate


def unsettled_flows(flows: np.ndarray, links: np.ndarray, capacity: np.ndarray, rate_cap: np.ndarray,
                    rate: np.ndarray, rtol: float = 1e-9, weight: np.ndarray | None = None) -> np.ndarray:
    """Flows (of ``rate_cap``'s length) that are below their cap and have no bottleneck link.

    ``flows``/``links`` are entries sorted by flow. A bottleneck of flow f is a link loaded
    to within ``rtol`` of capacity on which no flow is more than ``rtol`` faster than f.
    Flows crossing no link count as settled. A flow with a non-positive rate is unsettled. Rates are
    per unit of ``weight`` (a link carries weight x rate of each flow).
    """
    num_links = len(capacity)
    rate_e = rate[flows]
    load = np.bincount(links, weights=rate_e if weight is None else rate_e * weight[flows], minlength=num_links)
    fastest = np.zeros(num_links)
    np.maximum.at(fastest, links, rate_e)
    full = load >= capacity * (1.0 - rtol)
    ok = full[links] & (rate_e >= fastest[links] * (1.0 - rtol))
    unsettled = np.zeros(len(rate_cap), dtype=bool)
    if flows.size:
        starts = np.flatnonzero(np.concatenate(([True], flows[1:] != flows[:-1])))
        fid = flows[starts]
        unsettled[fid] = ~np.logical_or.reduceat(ok, starts) & (rate[fid] < rate_cap[fid] * (1.0 - rtol))
        unsettled[fid] |= rate[fid] <= 0.0
    return unsettled


def _one_flow(links: np.ndarray, capacity: np.ndarray, rate_cap: np.ndarray, weight: np.ndarray | None) -> np.ndarray:
    """:func:`_fill` of a single flow (one collective alone on the network, the common case), without its
    ~20 numpy calls per round: it freezes in the first round at the least share of its links, or its cap.
    Bit for bit that answer: a link's count adds the flow's weight once per entry in entry order, as
    ``bincount`` does, and the divisions and minima are the same IEEE operations
    (``tests/test_network.py::test_one_flow_fast_path_equals_progressive_filling``)."""
    w = 1.0 if weight is None else float(weight[0])
    count: dict[int, float] = {}
    for link in links.tolist():
        count[link] = count.get(link, 0.0) + w
    level = min(max(c / n, 0.0) for c, n in zip(capacity[list(count)].tolist(), count.values(), strict=True))
    cap = float(rate_cap[0])
    if math.isfinite(cap):
        level = min(level, cap)
    return np.array([level])


def _fill(flows: np.ndarray, links: np.ndarray, capacity: np.ndarray, rate_cap: np.ndarray,
          rtol: float, weight: np.ndarray | None = None) -> np.ndarray:
    """Progressive filling from scratch; entries sorted by flow (module docstring). ``count`` is the
    weight of unfrozen flows per link (their number when unweighted), ``entries`` their entries."""
    rate = np.array(rate_cap, dtype=float)  # caps of unfrozen flows, rates of frozen ones
    num_links = len(capacity)
    remaining = np.array(capacity, dtype=float)
    entries = np.bincount(links, minlength=num_links).astype(float)
    w_e = None if weight is None else weight[flows]
    count = entries if w_e is None else np.bincount(links, weights=w_e, minlength=num_links)
    share_of_link = np.zeros(num_links)
    # Each flow's entries are one segment: first entry, length, flow id, cap.
    starts = np.flatnonzero(np.concatenate(([True], flows[1:] != flows[:-1]))) if flows.size else flows
    seg = np.diff(np.append(starts, flows.size))
    fid = flows[starts]
    cap = rate[fid]
    capped = bool(np.isfinite(cap).any())  # skip the cap tests when no flow has a cap
    while links.size:
        np.divide(remaining, count, out=share_of_link, where=count > 0)
        np.maximum(share_of_link, 0.0, out=share_of_link)  # -0.0 from rounding on a filled link
        share = share_of_link[links]
        level = np.minimum.reduceat(share, starts)  # m(f)
        if capped:
            np.minimum(level, cap, out=level)
        level_e = level.repeat(seg)
        # Entry e agrees when its link's share is its flow's minimum; a link is ready when all agree.
        agree = np.bincount(links, weights=share <= level_e * (1.0 + rtol), minlength=num_links)
        freeze = np.logical_or.reduceat((agree == entries)[links], starts)
        if capped:
            freeze |= cap <= level * (1.0 + rtol)
        if not freeze.any():  # numerical safety net: freeze the globally lowest level
            freeze = level <= level.min() * (1.0 + rtol)
        rate[fid[freeze]] = level[freeze]
        gone = freeze.repeat(seg)
        gone_links = links[gone]
        if w_e is None:
            remaining -= np.bincount(gone_links, weights=level_e[gone], minlength=num_links)
            count -= np.bincount(gone_links, minlength=num_links)  # entries is count: same array
        else:
            remaining -= np.bincount(gone_links, weights=level_e[gone] * w_e[gone], minlength=num_links)
            count -= np.bincount(gone_links, weights=w_e[gone], minlength=num_links)
            entries -= np.bincount(gone_links, minlength=num_links)
            w_e = w_e[~gone]
        alive = ~freeze
        links = links[~gone]
        seg, fid = seg[alive], fid[alive]
        if capped:
            cap = cap[alive]
        ends = np.cumsum(seg)
        starts = ends - seg
    return rate
