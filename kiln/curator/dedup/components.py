"""Connected components of the duplicate graph (scipy on CPU, cuGraph on GPU); one kept each."""

from __future__ import annotations

import numpy as np
import pandas as pd


def duplicates_from_edges(edges: pd.DataFrame, use_cugraph: bool = False) -> tuple[np.ndarray, int]:
    """(`_row` keys to remove, number of clusters): each component keeps its smallest id."""
    if edges.empty:
        return np.zeros(0, dtype=np.int64), 0
    nodes = pd.concat(
        [
            edges[["a_row", "a_id"]].set_axis(["row", "id"], axis=1),
            edges[["b_row", "b_id"]].set_axis(["row", "id"], axis=1),
        ]
    ).drop_duplicates("row")
    nodes = nodes.sort_values(["id", "row"]).reset_index(drop=True)
    position = pd.Series(np.arange(len(nodes)), index=nodes["row"].to_numpy())
    src = position.loc[edges["a_row"].to_numpy()].to_numpy()
    dst = position.loc[edges["b_row"].to_numpy()].to_numpy()
    labels = (
        _cugraph_labels(src, dst, len(nodes))
        if use_cugraph
        else _scipy_labels(src, dst, len(nodes))
    )
    first = ~pd.Series(labels).duplicated().to_numpy()  # nodes are sorted by id: first = smallest
    return np.sort(nodes["row"].to_numpy()[~first]), int(first.sum())


def _scipy_labels(src, dst, n) -> np.ndarray:
    import scipy.sparse as sp
    from scipy.sparse.csgraph import connected_components

    graph = sp.coo_matrix((np.ones(len(src), dtype=np.int8), (src, dst)), shape=(n, n))
    return connected_components(graph, directed=False)[1]


def _cugraph_labels(src, dst, n) -> np.ndarray:
    import cudf
    import cugraph

    graph = cugraph.Graph()
    graph.from_cudf_edgelist(
        cudf.DataFrame({"src": src, "dst": dst}), source="src", destination="dst"
    )
    df = cugraph.weakly_connected_components(graph).to_pandas()
    labels = np.arange(n)  # isolated vertices cannot occur: every node has an edge
    labels[df["vertex"].to_numpy()] = df["labels"].to_numpy()
    return labels
