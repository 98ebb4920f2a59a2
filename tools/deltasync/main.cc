// Placeholder until the CLI lands in this folder.
int main() { return 0; }
