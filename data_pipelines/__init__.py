"""data_pipelines"""
