//! The workspace's integration tests, demo and README.
//!
//! This package publishes nothing. Its library exists so that the README's examples are
//! compiled as doc tests; the README follows.
#![doc = include_str!("../README.md")]
