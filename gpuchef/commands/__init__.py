"""The click commands, one module each (``bench``, ``ab``, ``top``, ``serve``, ``report``,
``replay``, ``bench_attention``), the group that registers them (``cli``: the ``gpuchef`` entry
point) and the one module of flags they share (``options``). A command imports no other command:
what two share lives in ``gpuchef.sessions``, ``gpuchef.experiments`` or ``options``."""
