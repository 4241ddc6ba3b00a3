"""What every job runs on: devices and precision, process groups, files and locks, argument bounds, trackers,
the Hub, and model loading."""
