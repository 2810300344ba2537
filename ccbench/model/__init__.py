"""Cost models: alpha-beta-gamma fits of measured records, topology simulation, exporters.

Units in this package: seconds, bytes, seconds per byte; bandwidths printed in GB/s
with 1 GB = 1e9 bytes. model/ reads records; it never imports a backend.
"""
