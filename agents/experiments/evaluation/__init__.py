"""``leakgym eval`` (``leakgym.agents.experiments.evaluation``): attackers against defenders.

* :mod:`.cli` — the command's arguments and ``main``;
* :mod:`.play` — episodes of a pair (:func:`~.play.evaluate`);
* :mod:`.payoff` — per-pair statistics and the payoff table;
* :mod:`.analysis` — best responses, who beats whom, equilibria;
* :mod:`.reporting` — payoff files, heatmap, gallery;
* :mod:`.episode_log` — per-episode rows written as pairs finish (``--resume``).

Nothing is imported here: ``leakgym eval`` loads :mod:`.cli`, which loads the rest.
"""
