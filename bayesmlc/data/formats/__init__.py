"""File formats: Extreme Classification text, Mulan ARFF, svmlight/libsvm, MATLAB and the .npz cache.

Use :func:`bayesmlc.data.io.read_dataset` / :func:`bayesmlc.data.io.write_dataset`, which pick the
format from the file extension; the modules here hold one format each.
"""
