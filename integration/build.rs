include!("../build/torch_link.rs");

fn main() {
    emit_torch_rpath();
}
