"""Sessions: the composition roots that put an engine (or a server), its load, the samplers and
the trace together — headless runs (``headless``), the dashboard's live session (``live`` with
its load feeder ``live_load``), an attached session on servers gpuchef does not host
(``attach``), a saved trace played back (``replay``), the HTTP front door's session side
(``serve``) — and the one trace export they share (``export``)."""
