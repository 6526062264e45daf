"""Reading inputs: finding what a path holds (rlprof's, verl's and MindSpeed-RL's layouts, Ascend collections, a crashed
run's leftovers) and reading it into tables (`readers/`), manifests, step metrics and the watch's timeline files; the
model a run computed with and the device a window ran on.
Uses only `tables`."""
