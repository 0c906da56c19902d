"""The papers' laws measured: sweeps of a Hessian norm over one parameter (`sweeps`) and the power-law fits
of what they measure (`fitting`).
"""
