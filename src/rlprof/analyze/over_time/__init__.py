"""The run over time: the watch's timeline (spikes, drift, stragglers), each captured window beside a normal one,
and the trends of a run's own step metrics. Uses `diagnosis` and the rooms below it."""
