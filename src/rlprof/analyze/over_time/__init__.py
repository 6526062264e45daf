"""The run over time: the watch's timeline as tables (watched.py) and its rules (spikes, levels, drift, stragglers:
timeline.py; contention: contention.py), each captured window beside a normal one, the rollout stage accounted for,
the files that name no step placed on one, and the trends of a run's own step metrics. Uses `diagnosis` and the
rooms below it."""
