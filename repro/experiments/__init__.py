"""Experiments and the command line: composing a point's config (:mod:`.compose`, :mod:`.validate`), running one
point (:mod:`.simulate`), experiments and their grids (:mod:`.expspec`, :mod:`.grid`, :mod:`.narrow`,
:mod:`.runner`, :mod:`.launch`, :mod:`.stopping`), results, figures and claims (:mod:`.results`, :mod:`.render`,
:mod:`.figures`, :mod:`.panels`, :mod:`.claims`, :mod:`.datasources`) and regression tracking (:mod:`.check`).

The top layer: may import every other package; nothing but the entry points imports it.
"""
