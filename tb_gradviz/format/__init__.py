"""The format: what tb_gradviz writes and reads, and where it goes.

Records and their layouts (`records`, `routing_map`), the summary metadata
(`metadata`), the event writer (`events`), the destinations (`storage`) and
the background upload to object stores (`upload`).
Imports no deep-learning framework: both the capture and the board use it.
"""
