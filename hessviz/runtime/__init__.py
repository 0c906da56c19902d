"""The runtime under every computation: the memory guard (`memory`), large buffers on huge pages (`pages`)
and the worker pool (`tasks`).
"""
