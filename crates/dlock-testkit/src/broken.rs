//! broken
