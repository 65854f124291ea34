"""facts"""
