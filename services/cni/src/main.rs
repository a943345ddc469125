//! meshwork-cni: the CNI plugin binary. Everything is in the library ([`meshwork_cni`]);
//! this reads the environment and stdin, and prints what it answers.

fn main() -> std::process::ExitCode {
    meshwork_cni::main_entry()
}
