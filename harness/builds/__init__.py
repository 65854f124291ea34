"""builds"""
