#![allow(dead_code)]
pub mod fixtures;
