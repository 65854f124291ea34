"""supervise"""
