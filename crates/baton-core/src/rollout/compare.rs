//! Comparing two answers to the same request, output by output: max
//! absolute difference, relative L2, cosine similarity and, for class
//! scores, top-1 agreement.
