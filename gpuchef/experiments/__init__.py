"""Experiments: what gpuchef measures by comparison. ``ab`` is the one A/B core (settings, run
order, window edges, marks, the comparison), run over two targets: the hosted engine
(``hosted``: `gpuchef ab`, the dashboard's live A/B) and HTTP servers (``http``: `gpuchef ab
--base-url` / ``url=``, `top --attach`'s A/B); ``ab_text`` is its printed table. ``capacity``
searches each setting's highest rate under SLOs, ``early_stop`` ends a probe whose SLO is
broken beyond doubt; ``attention`` times the attention kernels (`gpuchef bench-attention`)."""
