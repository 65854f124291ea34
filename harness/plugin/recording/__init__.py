"""What a test run records: each server's story for Allure, figures and the run record."""
