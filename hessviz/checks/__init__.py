"""Checks around a computation: its price before it runs (`cost`) and its agreement with autograd after
(`verify`).
"""
