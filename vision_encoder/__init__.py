"""vision_encoder"""
