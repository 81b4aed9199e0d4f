include!("../build/torch_link.rs");

fn main() {
    emit_torch_rpath();
    // Rust links with --as-needed, which drops libtorch_cuda.so because tch never names a
    // symbol from it; without it `tch::Cuda::is_available()` is false even on a GPU machine.
    println!("cargo:rustc-link-arg-bins=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg-bins=-ltorch_cuda");
    println!("cargo:rustc-link-arg-bins=-ltorch");
    println!("cargo:rustc-link-arg-bins=-Wl,--as-needed");
}
