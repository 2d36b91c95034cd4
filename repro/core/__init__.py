"""The vocabulary every layer shares: errors, seeding, and what a speculation is (proposer kinds, token trees).

Imports nothing of the project's.
"""
