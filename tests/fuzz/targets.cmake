# Fuzz targets of the engine (formats); text targets live in text_targets.cmake.
