"""Connected components without one process holding the graph: minimum-label propagation.

Every row with an edge starts labelled with the smallest position among itself and its
neighbours; a round sends each label that changed to the neighbours it could still lower, and
each partition keeps the smallest label it receives. When a round sends nothing, every row's
label is the smallest position of its component — the row that Data-Juicer's simhash BFS and
minhash union-find keep — and every row whose label is smaller than itself is dropped.

A round is one unit per node partition: it reads its own adjacency and labels and its slice of
every partition's messages from the round before, so a unit holds one partition's edges, never
the graph. Rounds end after about the diameter of the largest component (duplicate clusters are
shallow: a few rounds).
"""

from __future__ import annotations

import numpy as np

from elastic_sharding.dedup.arrays import PAIRS, POSITIONS


def _per_node_min(pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct nodes of `pairs` (sorted) and the smallest `other` of each."""
    pairs = pairs[np.lexsort((pairs["other"], pairs["node"]))]
    nodes, starts = np.unique(pairs["node"], return_index=True)
    return nodes, pairs["other"][starts]


def _messages(adjacency: np.ndarray, nodes: np.ndarray, labels: np.ndarray, senders: np.ndarray) -> np.ndarray:
    """(neighbour, label) for every edge of a sending node whose label is below the neighbour."""
    index = np.searchsorted(nodes, adjacency["node"])
    label = labels[index]
    useful = senders[index] & (label < adjacency["other"])
    out = np.empty(int(useful.sum()), dtype=PAIRS)
    out["node"] = adjacency["other"][useful]
    out["other"] = label[useful]
    return out


def first_round(adjacency: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """From this partition's edges (both directions): the adjacency to keep, the labels, the messages."""
    adjacency = np.unique(adjacency)
    nodes, smallest = _per_node_min(adjacency)
    labels = np.minimum(nodes, smallest)
    state = _labels(nodes, labels)
    return adjacency, state, _messages(adjacency, nodes, labels, np.ones(len(nodes), dtype=bool))


def next_round(adjacency: np.ndarray, state: np.ndarray, inbox: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Apply the messages received; returns the new labels and the messages they send."""
    nodes, labels = state["node"], state["other"].copy()
    if len(inbox):
        targets, smallest = _per_node_min(inbox)
        index = np.searchsorted(nodes, targets)
        labels[index] = np.minimum(labels[index], smallest)
    changed = labels < state["other"]
    return _labels(nodes, labels), _messages(adjacency, nodes, labels, changed)


def _labels(nodes: np.ndarray, labels: np.ndarray) -> np.ndarray:
    state = np.empty(len(nodes), dtype=PAIRS)
    state["node"], state["other"] = nodes, labels
    return state


def dropped(state: np.ndarray) -> np.ndarray:
    """The rows of a converged partition that are not the first of their component."""
    return np.sort(state["node"][state["other"] < state["node"]]).astype(POSITIONS)
