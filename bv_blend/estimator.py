class BVBlendEstimator:  # placeholder, replaced in the next commit
    pass
